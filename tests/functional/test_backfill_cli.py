"""`reshard backfill` through the CLI entry point (moto, in-process): exit codes and the summary."""

from __future__ import annotations

import json

from reshard.cli.main import main

from tests.backfill_support import Shim, logical, setup_migration


def test_backfill_command_summary_and_exit_codes(moto_dynamo, capsys, tmp_path):
    m, mapper, store = setup_migration(moto_dynamo, "sensor", "Tcli", path=tmp_path / "m.toml")
    shim = Shim(moto_dynamo, mapper, m.table)
    for i in range(30):
        shim.seed(logical("sensor", i))
    moto_dynamo.call("put_item", TableName=m.table, Item={"PK": {"S": "junk"}, "SK": {"S": "x"}})
    store.set_allowance(m.id, 1)  # `start --allow-unmappable 1`: the junk row is accepted (issue 13)
    # One worker: moto is not thread-safe (two workers flaked on "dictionary changed size during
    # iteration" inside moto); concurrent workers are tested on dynalite.
    code = main(["--output", "json", "backfill", str(tmp_path / "m.toml"), "--segments", "2", "--workers", "1",
                 "--page-size", "8"])
    out = capsys.readouterr()
    assert code == 0, out.err
    summary = json.loads(out.out)
    assert summary["finished"] and summary["done"] == 2 and summary["failed"] == []
    assert summary["moved"] == sum(mapper.moves(o) for o in shim.model.values())
    assert summary["unmappable"] == 1 and summary["unmoved"] >= 1
    # The copy's own counters (reshard.jobs.backfill.COUNTERS), not the read-back's recopied/undone.
    assert set(summary) >= {"scanned", "copied", "fenced", "duplicates", "collisions", "new_layout",
                            "consumed_here", "elapsed_seconds"}
    assert not {"recopied", "undone"} & set(summary)
    assert summary["copied"] + summary["fenced"] + summary["duplicates"] + summary["collisions"] == summary["moved"]

    # Re-running a finished backfill redoes nothing and still succeeds.
    assert main(["--output", "json", "backfill", m.id, "--segments", "2"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["worked_here"] == [] and again["moved"] == summary["moved"]
    assert main(["backfill", m.id, "--segments", "2"]) == 0
    text = capsys.readouterr().out
    assert f"of the moved: copied {summary['copied']}, fenced 0 " in text and "collisions 0 (not copied)" in text
    assert "unmappable items are listed by `reshard status" in text and "COLLISIONS" not in text
    assert "recopied" not in text and "undone" not in text

    # Without the allowance the same finished backfill exits 1, saying why in one line.
    store.set_allowance(m.id, 0)
    assert main(["backfill", m.id, "--segments", "2"]) == 1
    err = capsys.readouterr().err
    assert "left 1 unmappable item(s) behind and the allowance is 0" in err and err.count("reshard: error") == 1

    # A different segment count than the started run: refused, exit 2, one line.
    assert main(["backfill", m.id, "--segments", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("reshard: error: ") and "--segments 2" in err and err.count("\n") == 1


def test_backfill_command_refuses_outside_the_backfill_phase(moto_dynamo, capsys):
    from reshard.control.store import ControlStore
    from reshard.core.layout import KeyMapper
    from reshard.core.migration import parse
    from tests.backfill_support import create_table, migration_text
    m = parse(migration_text("hourly", "Tphase"))
    create_table(moto_dynamo, m.table, KeyMapper(m))
    ControlStore(moto_dynamo).register(m)
    assert main(["backfill", m.id]) == 2
    assert "in planned" in capsys.readouterr().err


def test_failed_segments_are_listed_and_exit_1(moto_dynamo, capsys, monkeypatch):
    from reshard import errors
    from reshard.aws.dynamo import Dynamo
    m, mapper, store = setup_migration(moto_dynamo, "invoices", "Tfail")
    shim = Shim(moto_dynamo, mapper, m.table)
    for i in range(12):
        shim.seed(logical("invoices", i))
    real = Dynamo.call

    def call(self, op, **kw):
        if op == "scan" and kw.get("Segment") == 1 and kw.get("TableName") == m.table:
            raise errors.AWSError("scan", "InternalServerError", "injected, after retries")
        return real(self, op, **kw)

    monkeypatch.setattr(Dynamo, "call", call)
    assert main(["--output", "json", "backfill", m.id, "--segments", "2", "--workers", "1"]) == 1
    out = capsys.readouterr()
    summary = json.loads(out.out)
    assert [f["segment"] for f in summary["failed"]] == [1] and summary["failed"][0]["attempts"] == 3
    assert "InternalServerError" in summary["failed"][0]["error"]
    assert "1 segment(s) failed: 1" in out.err
    monkeypatch.setattr(Dynamo, "call", real)
    # The next run retries it. One worker: two workers once both won the claim's compare-and-set
    # on moto (its requests now run one at a time: reshard/aws/moto_speedups.py); the claim race
    # itself is tested on dynalite.
    assert main(["--output", "json", "backfill", m.id, "--segments", "2", "--workers", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["worked_here"] == [1]


def _help(*args: str) -> str:
    from click.testing import CliRunner
    from reshard.cli.main import cli
    result = CliRunner().invoke(cli, [*args, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())  # one line: click wraps at its own width


def test_help_explains_the_time_fences():
    """--lease-seconds says the lease must exceed the longest request and what a worker stalled
    past its lease does; advance --wait says it also waits for job leases to go quiet; the
    backfill's help names its counters (no read-back, no re-copy)."""
    for cmd in ("backfill", "verify", "cleanup"):
        text = _help(cmd)
        assert "It must exceed the longest request: each attempt of a request is bounded by its connect + read " \
               "timeout (5 s + 30 s, shortened to a third of the lease when that is less)" in text, cmd
        assert "a worker stalled past it" in text and "sends nothing more" in text, cmd
    backfill = _help("backfill")
    assert "counted as fenced" in backfill and "collision" in backfill
    assert "recop" not in backfill and "read-back" not in backfill
    assert "sent only while the lease holds" in _help("verify")
    advance = _help("advance")
    assert "Into cutover, the same SECONDS also cover waiting for backfill and verify segment leases to go " \
           "quiet" in advance
    assert "a stalled worker stops at its own lease deadline" in advance
