"""The control table refuses rows it did not write (records.check_row, pure), and the keys
that let IAM tell the writers apart."""

from __future__ import annotations

import pytest

from reshard import errors
from reshard.control import records
from reshard.control.records import check_row
from reshard.core.wire import N, S


def meta(**over):
    row = {"pk": S("M#m1"), "sk": S("META"), "id": S("m1"), "table": S("T"), "phase": S("dual_write"),
           "phase_version": N(2), "file_text": S(""), "file_hash": S("h"), "schema": N(1)}
    return {**row, **over}


def beat(**over):
    row = {"pk": S("S#m1"), "sk": S("S#i-1"), "instance": S("i-1"), "phase": S("planned"), "phase_version": N(1),
           "schema": N(1)}
    return {**row, **over}


GOOD = [
    meta(),
    {k: v for k, v in meta().items() if k != "schema"},  # written before rows carried a schema
    beat(),
    beat(pk=S("M#m1")),  # a heartbeat where an older release wrote it
    {"pk": S("M#m1"), "sk": S("H#00000002"), "from": S("planned"), "to": S("dual_write"), "schema": N(1)},
    {"pk": S("J#m1#backfill"), "sk": S("R#backfill#000001"), "job": S("backfill"), "schema": N(1)},
    {"pk": S("J#m1#verify"), "sk": S("J#verify#000001#00003"), "owner": S("h:1:ab")},
    {"pk": S("J#m1#verify"), "sk": S("D#verify#000001#abc"), "body": S("{}")},
    {"pk": S("J#m1#backfill"), "sk": S("U#backfill#abc"), "job": S("backfill")},
    {"pk": S("T#T"), "sk": S("ACTIVE"), "migration_id": S("m1"), "schema": N(1)},
]

BAD = [
    (meta(schema=N(2)), "schema '2'"),
    (meta(schema=S("1")), "schema '1'"),
    (beat(schema=N(7)), "does not know"),
    (meta(id=S("m2")), "says id 'm2' but sits under 'm1'"),  # a META copied under another id
    (meta(phase=S("warp")), "no valid phase"),
    (beat(instance=S("i-2")), "says instance 'i-2'"),  # one shim's row naming another
    ({"pk": S("S#m1"), "sk": S("META"), "id": S("m1"), "phase": S("complete")}, "no row reshard writes"),
    ({"pk": S("J#m1#verify"), "sk": S("R#backfill#000001"), "job": S("backfill")}, "names another job"),
    ({"pk": S("J#m1#backfill"), "sk": S("R#backfill#000001"), "job": S("verify")}, "says job 'verify'"),
    ({"pk": S("T#T"), "sk": S("ACTIVE")}, "without an owner"),
    ({"pk": S("X#1"), "sk": S("x")}, "no row reshard writes"),
]


@pytest.mark.parametrize("row", GOOD, ids=lambda r: f"{r['pk']['S']}/{r['sk']['S']}")
def test_rows_reshard_writes_pass(row):
    check_row(row)


@pytest.mark.parametrize("row, says", BAD, ids=[b[1] for b in BAD])
def test_rows_it_did_not_write_fail_closed_with_one_clear_line(row, says):
    with pytest.raises(errors.ForeignControlRow) as e:
        check_row(row)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert e.value.exit_code == 2


def test_parsing_a_row_checks_it():
    with pytest.raises(errors.ForeignControlRow):
        records.MigrationState.from_item(meta(schema=N(99)))
    with pytest.raises(errors.ForeignControlRow):
        records.Heartbeat.from_item(beat(instance=S("someone-else")))
    with pytest.raises(errors.ForeignControlRow):
        records.RunInfo.from_item("m1", {"pk": S("J#m1#verify"), "sk": S("R#backfill#000001")})
    assert records.Heartbeat.from_item(beat()).migration_id == "m1"
    assert records.Heartbeat.from_item(beat(pk=S("M#m1"))).migration_id == "m1"


def test_each_writer_has_its_own_partitions():
    # The phase row, history and lock; the heartbeats; each job's rows: never one partition.
    mine = {records.migration_pk("m"), records.heartbeat_pk("m"), records.table_lock_pk("m"),
            *(records.jobs_pk("m", j) for j in ("backfill", "verify", "cleanup"))}
    assert len(mine) == 6


def test_carries_tells_a_writers_own_landed_write():
    """``core/wire.carries``: what a conditional write set, found in the row after its resend
    failed. Numbers by value (DynamoDB normalises ``1700000000.0`` to ``1700000000``); any other
    value, or a missing attribute, is another writer's row; None: a delete's effect."""
    from reshard.core.wire import N, S, carries
    row = {"pk": S("M#x"), "phase_version": {"N": "7"}, "updated_at": {"N": "1700000000"}, "updated_by": S("a@h")}
    assert carries(row, {"phase_version": N(7), "updated_at": N(1700000000.0), "updated_by": S("a@h")})
    assert not carries(row, {"phase_version": N(7), "updated_at": N(1700000000.5)})
    assert not carries(row, {"updated_by": S("b@h")})
    assert not carries(row, {"last_action": S("advance")})
    assert not carries(row, {"updated_by": N(1)}) and not carries(row, {"phase_version": S("7")})
    assert carries(None, None) and not carries(row, None) and not carries(None, {"pk": S("M#x")})
