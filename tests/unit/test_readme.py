"""README.md's second command is what CI runs (.ci/run), so the two cannot drift apart."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M)
    assert block, "README.md has no fenced code block"
    return block.group(1).splitlines()


def ci_command() -> str:
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in lines
                if line and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    assert len(commands) == 1, commands
    return commands[0]


def test_readme_first_block_has_exactly_two_commands():
    cmds = readme_commands()
    assert len(cmds) == 2, cmds
    assert all(c.strip() for c in cmds)


def test_ci_runs_the_readme_second_command():
    assert readme_commands()[1] == ci_command()


def test_readme_starts_with_the_commands():
    """The two commands come first: only the title precedes the block."""
    text = (ROOT / "README.md").read_text()
    before = text.split("```", 1)[0]
    assert [line for line in before.splitlines() if line.strip()] == ["# reshard"]
