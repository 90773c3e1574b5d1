"""Every command the runbooks show, run against dynalite, and the quoted output's shape checked.

One small migration (the runbooks' own file, pointed at a fresh table with one unmappable
row) walks 01 → 08 through the commands of each runbook's ``sh`` blocks, in order; the
incidents run where they apply; 09 (abort) runs on a second control table. Glue between
runbooks (what a runbook's "Decisions" tell the operator to do) is listed in ``GLUE``.

Then every labelled line quoted in a runbook's output blocks (``phase:``, ``next:``,
``backfill run N:``, ``reshard: error: advance refused for``, ...) must exist, in the same
shape (digits, ids and quoted values normalised), in what the commands printed. The few
quoted lines this small walk cannot produce are in ``NOT_REPRODUCED`` with the reason.
"""

from __future__ import annotations

import pathlib
import re
import shlex

import pytest

from reshard.cli.main import main
from reshard.core.layout import KeyMapper
from reshard.core.migration import parse

from tests.backfill_support import create_table, logical, migration_text
from tests.conftest import ROOT

RUNBOOKS = ROOT / "runbooks"
FILE = "migrations/0001_sensor_events.toml"
MID = "sensor-events-16-to-32"

#: Quoted lines (their shape key) the walk does not produce, and why.
NOT_REPRODUCED = {
    "COLLISIONS": "two differing pre-migration copies need a random-suffix table "
                  "(tests/integration/test_interleavings_duplicates.py)",
    "COLLISIONS (two pre-migration copies of one item differ; whichever the backfill met first was copied, the "
    "other never over it; verify fails until you decide which is right": "as above",
    "- the backfill is incomplete": "an interrupted backfill (tests/functional/test_phase_cli.py, "
                                    "test_status_lists_job_runs_and_segments)",
    **{f"FOUND {kind}": "a doctor finding needs crafted leftovers (tests/integration/test_doctor.py); the walk "
                        "runs every doctor command on a clean control table"
       for kind in ("orphaned_lease", "expired_lease", "abandoned_run", "stale_shim", "old_tombstones")},
}


def blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block."""
    out, lang, body = [], None, []
    for line in text.splitlines():
        if line.startswith("```"):
            if lang is None:
                lang, body = line[3:].strip(), []
            else:
                out.append((lang, "\n".join(body) + "\n"))
                lang = None
        elif lang is not None:
            body.append(line)
    return out


def sh_commands(text: str) -> list[tuple[str, str]]:
    """``(command, comment)`` of every ``reshard`` line in the ``sh`` blocks."""
    out = []
    for block in [b for lang, b in blocks(text) if lang == "sh"]:
        for line in block.replace("\\\n", " ").splitlines():
            cmd, _, comment = line.partition("#")
            if cmd.strip().startswith("reshard "):
                out.append((cmd.strip(), comment.strip()))
    return out


def quoted_lines(text: str) -> list[str]:
    """The lines of the plain (output) blocks."""
    return [l for lang, block in blocks(text) if lang == "" for l in block.splitlines()]


def shape(line: str) -> str | None:
    """The label of an output line, normalised, or None for lines without one (values, tables)."""
    s = line.strip()
    if not s or s == "..." or s.startswith("$ "):
        return None
    s = re.sub(r"'[^']*'", "Q", s)
    s = re.sub(r"`[^`]*`", "C", s)
    s = s.replace(MID, "MID")
    s = re.sub(r"\d+(\.\d+)?", "N", s)
    if s.startswith("reshard: error:"):
        return " ".join(s.split()[:5]).rstrip(":")  # "reshard: error: advance refused for", "... start refused: N"
    label, colon, _ = s.partition(":")
    if not colon or len(label.split()) > 6 or label.endswith(" vm") or label.endswith(" owner vm"):
        return None
    return label.strip()


class Walk:
    """Runs commands against one control table; keeps everything they printed."""

    def __init__(self, capsys, endpoint: str, control: str, path: str):
        self.capsys, self.endpoint, self.control, self.path = capsys, endpoint, control, path
        self.printed: list[str] = []
        self.ran: list[tuple[str, int]] = []

    def run(self, command: str, expect: int = 0, says: str = "") -> str:
        argv = shlex.split(command.replace(FILE, self.path))[1:]
        if argv[0] in ("advance", "rollback", "abort"):
            argv.append("--allow-no-shims")  # no application runs in this test
        code = main(["--endpoint-url", self.endpoint, "--control-table", self.control, *argv])
        out, err = self.capsys.readouterr()
        assert "internal error" not in err and "Traceback" not in err, (command, err)
        assert code == expect, (command, code, out, err)
        assert says in out + err, (command, says, out + err)
        self.printed += (out + err).splitlines()
        self.ran.append((command, code))
        return out

    def runbook(self, name: str, expect: dict | None = None, conditional: bool = False,
                then: dict | None = None) -> None:
        """Run ``name``'s commands; ``expect``: a command's (exit, text) when not (0, "");
        ``then``: a GLUE command run right after one (what the runbook's text says to do)."""
        for cmd, comment in sh_commands((RUNBOOKS / name).read_text()):
            if comment.startswith("only if") and not conditional:
                continue  # the runbook says when; the walk is not in that case
            code, says = (expect or {}).get(cmd, (0, ""))
            self.run(cmd, code, says)
            if cmd in (then or {}):
                self.run(then[cmd])


@pytest.fixture
def world(dynalite, dynalite_server, unique_name, tmp_path):
    table = f"{unique_name}-data"
    path = tmp_path / "m.toml"
    path.write_text(migration_text("sensor", table))
    mapper = KeyMapper(parse(path.read_text(), str(path)))
    create_table(dynalite, table, mapper)
    items = [mapper.to_physical(logical("sensor", i), mapper.old) for i in range(8)]
    legacy = {"PK": {"S": "legacy-row"}, "SK": {"S": "2024-10-27T15:00:00Z"}, "temp": {"N": "1"}}
    dynalite.batch_write(table, [{"PutRequest": {"Item": i}} for i in [*items, legacy]])
    # 09's migration: its own table (the first one ends in the new layout).
    path2 = tmp_path / "abort" / FILE
    path2.parent.mkdir(parents=True)
    path2.write_text(migration_text("sensor", f"{table}-2"))
    create_table(dynalite, f"{table}-2", mapper)
    dynalite.batch_write(f"{table}-2", [{"PutRequest": {"Item": i}} for i in items])
    return {"dynalite": dynalite, "endpoint": dynalite_server.endpoint, "table": table, "path": str(path),
            "path2": str(path2),
            "control": f"{unique_name}-ctl", "legacy": legacy, "tmp": tmp_path, "mapper": mapper}


def test_every_runbook_command_runs_and_its_quoted_output_exists(world, capsys):
    w = Walk(capsys, world["endpoint"], world["control"], world["path"])
    # The table holds one unmappable row: start refuses it (01 quotes that), and 01's text says
    # `reshard start FILE --allow-unmappable N` allows it explicitly.
    w.runbook("01-start.md", expect={f"reshard start {FILE}": (2, "start refused: 1 problem(s)"),
                                     f"reshard plan {FILE} --max-wcu 2000 --peak-writes-per-sec 2000 --item-kb 1":
                                         (1, "`reshard start` would refuse")},
              then={f"reshard start {FILE}": f"reshard start {FILE} --allow-unmappable 1"})
    w.runbook("02-dual-write.md")
    w.runbook("03-dual-read.md")
    w.runbook("04-backfill.md")
    w.runbook("incident-lease.md")
    w.runbook("incident-throttling.md")
    w.runbook("metrics-and-alarms.md")  # its backfills join the finished run, with their metrics on
    # Its plan lists the unmappable row: what `start` refuses without an allowance, so exit 1.
    w.runbook("incident-unmappable.md", expect={f"reshard plan {FILE} --sample 0": (1, "would refuse")})
    # GLUE (incident-unmappable.md, "Decisions"): the legacy row is garbage; delete it, then verify.
    world["dynalite"].call("delete_item", TableName=world["table"],
                           Key={"PK": world["legacy"]["PK"], "SK": world["legacy"]["SK"]})
    w.runbook("05-verify.md")
    w.runbook("06-cutover.md")
    w.runbook("07-rollback.md")
    # GLUE (07, "Decisions"): the backfill stays done and verify passed after it: cutover again.
    w.run("reshard advance --wait 60", says="moved backfill -> cutover")
    w.run("reshard verify --segments 2")  # GLUE (06): the catch-up verify after the switch
    w.run("reshard advance --wait 5 --from cleanup", expect=2, says="it is in cutover")  # --from guards scripts
    w.runbook("08-cleanup.md", expect={
        "reshard cleanup --segments 16": (2, "Run with --enable-ttl"),  # TTL is off on the table (08 says so)
        # dynalite has no TTL API (DynamoDB has): the failure is one line, exit 1, and --delete follows.
        "reshard cleanup --segments 16 --enable-ttl": (1, "update_time_to_live failed: UnknownOperationException"),
    })
    w.run(f"reshard rollback {MID}", expect=2, says="rollback is refused in complete")
    w.runbook("doctor.md")
    assert "phase:     complete" in "\n".join(w.printed)

    # 09 and the lagging-shim incident: a second migration on its own control table.
    a = Walk(capsys, world["endpoint"], world["control"] + "-2", world["path2"])
    a.run(f"reshard start {FILE}")
    a.runbook("incident-shim-lagging.md")  # wait and advance --dry-run: nothing moves
    for _ in range(3):
        a.run("reshard advance")  # GLUE: to backfill
    a.run("reshard backfill --segments 2")  # GLUE: to cutover, where 09's transcript starts
    a.run("reshard verify --segments 2")
    a.run("reshard advance", says="moved backfill -> cutover")
    a.run("reshard abort", expect=2, says="abort is refused in cutover")  # 09's transcript
    a.runbook("09-abort.md", conditional=True)  # its rollback "only if in cutover" runs
    assert "(retired: cleaned up, the table is free)" in "\n".join(a.printed)

    printed = {shape(l) for l in w.printed + a.printed} - {None}
    missing = {}
    for md in sorted(set(RUNBOOKS.glob("*.md")) - {RUNBOOKS / "README.md"}):  # the index quotes a diagram
        for line in quoted_lines(md.read_text()):
            key = shape(line)
            if key and key not in printed and key not in NOT_REPRODUCED:
                missing.setdefault(md.name, []).append(line.strip())
    assert missing == {}, "quoted in the runbooks but never printed:\n" + "\n".join(
        f"{md}: {line}" for md, lines in missing.items() for line in lines)
    ran = {c for c, _ in w.ran + a.ran}
    for md in sorted(RUNBOOKS.glob("*.md")):
        for cmd, comment in sh_commands(md.read_text()):
            assert cmd in ran or comment.startswith("only if"), (md.name, cmd)
