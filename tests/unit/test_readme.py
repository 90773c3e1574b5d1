"""README.md's second command is what CI runs (.ci/run), in a fresh virtualenv, so the two cannot
drift apart and an undeclared dependency fails CI (tests/unit/test_ci_run.py runs the script)."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M)
    assert block, "README.md has no fenced code block"
    return block.group(1).splitlines()


def ci_lines() -> list[str]:
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


#: What .ci/run does before the README's command, in this order: a virtualenv made anew
#: (never with the machine's site-packages), activated, and the pinned versions.
CI_PREAMBLE = ["set -euo pipefail", 'cd "$(dirname "$0")/.."', "rm -rf .ci/.venv", "python3 -m venv .ci/.venv",
               ". .ci/.venv/bin/activate", 'export PIP_CONSTRAINT="$PWD/constraints.txt"']


def ci_command() -> str:
    lines = ci_lines()
    assert lines[:-1] == CI_PREAMBLE, lines
    return lines[-1]


def test_readme_first_block_has_exactly_two_commands():
    cmds = readme_commands()
    assert len(cmds) == 2, cmds
    assert all(c.strip() for c in cmds)


def test_ci_runs_the_readme_second_command():
    assert readme_commands()[1] == ci_command()


def test_ci_builds_its_own_virtualenv_first():
    lines = ci_lines()
    assert not any("system-site-packages" in line for line in lines)
    assert lines.index("rm -rf .ci/.venv") < lines.index("python3 -m venv .ci/.venv") \
        < lines.index(". .ci/.venv/bin/activate") < lines.index(ci_command())
    assert ".venv/" in (ROOT / ".gitignore").read_text().split()  # the virtualenv is never committed


def test_readme_starts_with_the_commands():
    """The two commands come first: only the title precedes the block."""
    text = (ROOT / "README.md").read_text()
    before = text.split("```", 1)[0]
    assert [line for line in before.splitlines() if line.strip()] == ["# reshard"]
