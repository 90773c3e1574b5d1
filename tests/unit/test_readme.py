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


def sections(text: str) -> list[str]:
    return re.findall(r"(?m)^## (.*)$", text)


def section(text: str, name: str) -> str:
    return re.search(rf"(?ms)^## {re.escape(name)}\n(.*?)(?=^## |\Z)", text).group(1)


def test_readme_order_commands_then_try_it_then_concepts():
    """The two commands, then "Try it on your own table", then the concepts, then the rest."""
    names = sections((ROOT / "README.md").read_text())
    assert names[:3] == ["Try it on your own table", "What it does, for whom", "The phases"], names
    assert {"Running the demo", "Limits and costs", "Tests"} <= set(names[3:])


def test_try_it_starts_the_local_server_and_walks_the_migration():
    text = section((ROOT / "README.md").read_text(), "Try it on your own table")
    assert "reshard local --create" in text and "--load" in text and "export AWS_ENDPOINT_URL=" in text
    assert "reshard plan" in text and "reshard start" in text and "reshard verify" in text
    assert len(text.splitlines()) <= 40  # short: the details are further down


def test_limits_is_a_summary_and_the_figures_live_in_docs_benchmarks():
    text = (ROOT / "README.md").read_text()
    limits = section(text, "Limits and costs")
    assert "|---" not in limits and "](docs/benchmarks.md" in limits  # no benchmark table, a link instead
    bench = (ROOT / "docs" / "benchmarks.md").read_text()
    assert "| copy: client CPU per moved item" in bench and "## The demo" in bench


def test_the_readme_counts_the_examples_it_has():
    words = {4: "Four", 5: "Five", 6: "Six", 7: "Seven", 8: "Eight"}
    n = len(list((ROOT / "migrations").glob("*.toml")))
    text = (ROOT / "README.md").read_text()
    assert f"{words[n]} examples are there" in text
    stale = [w for k, w in words.items() if k != n and re.search(rf"\b{w} examples\b", text, re.I)]
    assert stale == []


def slug(header: str) -> str:
    """GitHub's anchor of a header."""
    return re.sub(r"[^\w\- ]", "", header.strip().lower()).replace(" ", "-")


def test_every_relative_link_of_the_readme_and_docs_resolves():
    problems = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"(?ms)^```.*?^```", "", doc.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # an absolute URL
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                problems.append(f"{doc.name}: {target}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in {
                    slug(h) for h in re.findall(r"(?m)^#+ (.*)$", file.read_text())}:
                problems.append(f"{doc.name}: {target}: no such section")
    assert problems == []


def test_the_readme_demo_sample_is_a_run_of_todays_report():
    """The sample output is pasted from a real run of the current report (its lines, no
    internal counter names), and says how long it took at which load."""
    text = section((ROOT / "README.md").read_text(), "Running the demo")
    sample = re.search(r"(?ms)^```\n(.*?)^```", text).group(1)
    for label in ("phases:", "app traffic:", "items:", "backfill:", "verify:", "cleanup:", "final check:",
                  "time:", "RESULT: OK, every check held"):
        assert re.search(rf"(?m)^{re.escape(label)}", sample), label
    for word in ("fenced", "changed_meanwhile", "gsi_", "tombstone", "phase version"):
        assert word not in sample
    assert re.search(r"(?m)^time: +[\d.]+ s on \d+ cores at load average [\d.]+ = fill ", sample)
