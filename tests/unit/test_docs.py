"""README.md and runbooks/ name only commands and options the CLI really has.

Every runbook linked from runbooks/README.md exists, and every ``reshard ...``
command line in a code span or code block of the README or a runbook names a real
command with options that command accepts.
"""

from __future__ import annotations

import pathlib
import re
import shlex

import click
import pytest

from reshard.cli.main import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNBOOKS = ROOT / "runbooks"


def doc_files() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted(RUNBOOKS.glob("*.md"))]


def linked_runbooks() -> list[str]:
    text = (RUNBOOKS / "README.md").read_text()
    return sorted(set(re.findall(r"\]\(([^)#]+\.md)\)", text)))


def code_text(md: str) -> list[str]:
    """The contents of fenced code blocks (one string per line) and inline code spans."""
    out = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", md, re.S | re.M):
        out += block.splitlines()
    prose = re.sub(r"^```[a-z]*\n.*?^```", "", md, flags=re.S | re.M)
    out += re.findall(r"`([^`\n]+)`", prose)
    return out


def reshard_invocations(md: str) -> list[list[str]]:
    """Token lists after each ``reshard`` (or ``python3 -m reshard``) in code."""
    found = []
    for line in code_text(md):
        line = line.split("  #")[0].split(" # ")[0]
        for m in re.finditer(r"(?:^|[\s$(;&|])reshard\s+(.*?)(?=\s*(?:&&|\|\||[;|)]|$))", line):
            try:
                tokens = shlex.split(m.group(1))
            except ValueError:
                tokens = m.group(1).split()
            if tokens and tokens[0] != "import":  # `from reshard import ShardedTable` is Python
                found.append(tokens)
    return found


def _options(cmd: click.Command) -> dict[str, click.Option]:
    return {name: p for p in cmd.params if isinstance(p, click.Option) for name in p.opts + p.secondary_opts}


def check_invocation(tokens: list[str]) -> str | None:
    """None if the tokens are a valid ``reshard`` call as far as names go, else why not."""
    group_opts = _options(cli)
    i = 0
    while i < len(tokens) and tokens[i].startswith("-"):
        name = tokens[i].split("=")[0]
        if name not in group_opts and name not in ("--help", "-h", "--version"):
            return f"unknown global option {name}"
        i += 1 if "=" in tokens[i] or group_opts.get(name, None) is None or group_opts[name].is_flag else 2
    if i >= len(tokens):
        return None
    name = tokens[i]
    if not re.fullmatch(r"[a-z][a-z-]*", name):
        return None  # a placeholder such as <command> or ...
    if name not in cli.commands:
        return f"no command {name!r}"
    opts = _options(cli.commands[name])
    for t in tokens[i + 1:]:
        if t.startswith("--") and re.fullmatch(r"--[a-z][a-z-]*(=.*)?", t):
            if t.split("=")[0] not in opts and t not in ("--help",):
                return f"`reshard {name}` has no option {t.split('=')[0]}"
    return None


def test_every_linked_runbook_exists():
    links = linked_runbooks()
    assert len(links) >= 13
    missing = [l for l in links if not (RUNBOOKS / l).is_file()]
    assert missing == []


def test_every_runbook_is_linked_from_the_index():
    files = {p.name for p in RUNBOOKS.glob("*.md")} - {"README.md"}
    assert files <= set(linked_runbooks())


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.name)
def test_documented_commands_are_real(path):
    calls = reshard_invocations(path.read_text())
    problems = [f"reshard {' '.join(t)}: {why}" for t in calls if (why := check_invocation(t))]
    assert problems == []


def test_the_docs_mention_every_command():
    text = "\n".join(p.read_text() for p in doc_files())
    named = {t[0] for t in reshard_invocations(text) if t}
    assert set(cli.commands) - named == set()


def test_the_checker_catches_a_wrong_command_and_option():
    assert check_invocation(["frobnicate"]) == "no command 'frobnicate'"
    assert "no option --segmentz" in check_invocation(["backfill", "--segmentz", "4"])
    assert check_invocation(["--output", "json", "status", "--endpoint-url", "http://127.0.0.1:8000"]) is None
    assert reshard_invocations("run `reshard advance --wait 60` now\n```sh\nreshard status  # look\n```\n") == [
        ["status"], ["advance", "--wait", "60"]]


def test_every_command_help_has_an_example():
    missing = [n for n, c in cli.commands.items() if "Example" not in (c.help or "")]
    assert missing == []


def test_help_examples_are_real_invocations():
    problems = []
    for name, c in cli.commands.items():
        examples = (c.help or "").split("Example:", 1)[-1].replace("\\\n", " ")
        for line in examples.splitlines():
            line = line.strip()
            if line.startswith("reshard "):
                tokens = shlex.split(line.split(" #")[0])[1:]
                if why := check_invocation(tokens):
                    problems.append(f"{name}: {line}: {why}")
    assert problems == []
