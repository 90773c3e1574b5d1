"""A fuzz test over control rows and data items (issue 30): whatever a row or an item holds --
any attribute types, sizes and strings, escape sequences included -- status, the census,
doctor, verify and the shim never crash, never wait without end and never print an escape
sequence. (Property: every outcome is a result or one of reshard's own errors.)

Each example writes several rows of the kinds reshard reads (heartbeats in the app's
partition, attributes of the META row, a history row, job rows of each kind, the table lock,
rows under keys reshard never writes) or one data item with bookkeeping attributes of any
kind, then drives every reader once, on moto; every wait runs on a simulated clock and must
end within a bound (no real waits).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from reshard import errors
from reshard.aws.dynamo import to_wire
from reshard.cli.main import main
from reshard.control import fleet
from reshard.control.store import ControlStore
from reshard.control.transition import transition
from reshard.core import decode
from reshard.core.layout import KeyMapper
from reshard.core.migration import load
from reshard.core.phases import Action
from reshard.jobs.runner import JobOptions
from reshard.jobs.verify import verify_read_only
from reshard.shim.table import ShardedTable

from tests.functional.test_phase_cli import CT, MID, SENSOR_FILE, make_table

pytestmark = pytest.mark.functional

#: Characters a terminal acts on.
RAW = ("\x1b", "\x07", "\x9b", "\x90", "\x9d", "\u202e")

# --------------------------------------------------------------------------- any attribute value

texts = st.one_of(st.text(max_size=30), st.sampled_from(["\x1b]0;owned\x07", "\x1b[2J\x1b[H", "a\nFAKE: ok", "\u202eevil",
                                                          "9999999999999.999999.zz", "", "x" * 3000]))
numbers = st.one_of(st.integers(-10 ** 20, 10 ** 20).map(str), st.sampled_from(["1E+125", "-1E+125", "1E-130", "0.5",
                                                                                "-0", "123456789012345678901234567890"]))
scalars = st.one_of(
    texts.map(lambda s: {"S": s}), numbers.map(lambda n: {"N": n}), st.binary(max_size=8).map(lambda b: {"B": b}),
    st.booleans().map(lambda b: {"BOOL": b}), st.just({"NULL": True}),
    st.lists(st.text(max_size=6), min_size=1, max_size=3, unique=True).map(lambda xs: {"SS": xs}),
    st.lists(st.integers(-99, 99), min_size=1, max_size=3, unique=True).map(lambda xs: {"NS": [str(x) for x in xs]}))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3).map(lambda xs: {"L": xs}),
    st.dictionaries(st.text(min_size=1, max_size=5), inner, max_size=3).map(lambda m: {"M": m})), max_leaves=5)

#: The attribute names reshard reads in each kind of row (decode.ROW_TYPES), and a few others.
NAMES = ["instance", "host", "pid", "phase", "phase_version", "at", "liveness_seconds", "refresh_seconds", "beat",
         "request_seconds", "write_seconds", "schema", "id", "table", "file_text", "file_hash", "switching",
         "retired", "allow_unmappable", "item_count", "item_count_at", "from", "to", "action", "who", "job", "run",
         "total_segments", "started_at", "finished_at", "totals", "owner", "lease_expires", "lease_counter", "done",
         "failed", "checkpoint", "counters", "last_error", "lease_seconds", "max_request_seconds", "segment",
         "old_key", "reason", "detail", "body", "version", "shares", "max_wcu", "member", "idle", "migration_id",
         "zz\x1b"]
attributes = st.dictionaries(st.sampled_from(NAMES), values, max_size=6)

KEYS = [
    ("S#{id}", "S#fuzz"), ("S#{id}", "S#\x1b[31mred"), ("M#{id}", "S#old-release"), ("M#{id}", "META"),
    ("M#{id}", "H#00000009"), ("J#{id}#backfill", "R#backfill#000001"), ("J#{id}#backfill", "J#backfill#000001#00000"),
    ("J#{id}#backfill", "U#backfill#abc"), ("J#{id}#verify", "D#verify#000001#abc"),
    ("J#{id}#backfill", "B#backfill#000001"), ("J#{id}#backfill", "B#backfill#000001#m1"),
    ("T#SensorEvents", "ACTIVE"), ("S#{id}", "junk"), ("X#1", "whatever"),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A migration in backfill, a few items through a shim, on moto (one for the module)."""
    from moto import mock_aws

    from reshard.aws.dynamo import Dynamo, RetryPolicy
    with mock_aws():
        d = Dynamo(region="us-east-1", retry=RetryPolicy(max_attempts=2, base_seconds=0.001),
                   connect_timeout=1, read_timeout=4)
        make_table(d, "SensorEvents")
        store = ControlStore(d, "rs-control")
        m = load(SENSOR_FILE)
        store.register(m)
        for _ in range(3):
            transition(store, MID, Action.ADVANCE, allow_no_shims=True)
        with ShardedTable(m, d, control_table=store.table, refresh_seconds=3600) as shim:
            for i in range(3):
                shim.put_item(Item={"sensor_id": "s-1", "event_id": f"e-{i}", "ts": f"2024-10-27T15:0{i}:00Z"})
        yield d, store, m


def run_cli(capsys, *args: str) -> tuple[int, str]:
    code = main([*args, *CT])
    out, err = capsys.readouterr()
    return code, out + err


def clean(text: str) -> None:
    assert "internal error" not in text and "Traceback" not in text, text[-2000:]
    assert not [c for c in RAW if c in text], text[-2000:]


#: The longest any wait may last, whatever the rows say: a lagging shim watched silent
#: (600 + 300 s), then verify's settle window (1,200 s) per look, a few looks (simulated time).
BOUND = 2 * (decode.MAX_LIVENESS_SECONDS + decode.MAX_REQUEST_SECONDS) + 6 * decode.MAX_WRITE_SECONDS


def drive_readers(d, store, m, capsys) -> None:
    """status (text and table), advance --dry-run, doctor, the census's wait, verify, a
    shim: once each. The waits run on a simulated clock: each must end within BOUND."""
    for args in (("status", MID), ("status", MID, "--output", "table"), ("advance", MID, "--dry-run"),
                 ("doctor", MID)):
        code, text = run_cli(capsys, *args)
        assert code in (0, 1, 2), (args, code)
        clean(text)
    clock = [1_000.0]

    def sleep(s: float) -> None:
        assert s >= 0
        clock[0] += max(s, 0.001)
        assert clock[0] <= 1_000 + BOUND, "a wait without end"

    watcher = ControlStore(d, store.table, clock=lambda: clock[0])
    try:
        c = fleet.wait_for_ack(watcher, MID, 4, BOUND, sleep=sleep, poll=100)
        clean(" ".join(c.describe_lagging()))
    except errors.ReshardError as e:
        clean(str(e))
    clock[0] = 1_000.0
    watcher = ControlStore(d, store.table, clock=lambda: clock[0])
    try:
        result = verify_read_only(d, watcher, MID, JobOptions(segments=1, workers=1, page_size=50, rechecks=2,
                                                              recheck_pause=0.0), clock=lambda: clock[0],
                                  sleep=sleep, monotonic=lambda: clock[0])
        clean(json.dumps(result.as_dict(), ensure_ascii=False, default=str))
    except errors.ReshardError as e:
        clean(str(e))
    shim = ShardedTable(m, d, control_table=store.table, refresh_seconds=3600, start=False)
    try:
        shim.refresh()
        for call in (lambda: shim.get_item(Key={"sensor_id": "s-1", "event_id": "e-1", "ts": "2024-10-27T15:01:00Z"}),
                     lambda: shim.put_item(Item={"sensor_id": "s-1", "event_id": "e-2", "ts": "2024-10-27T15:02:00Z"}),
                     lambda: shim.scan()):
            try:
                call()
            except errors.ReshardError as e:  # a ClientError too: refused, never crashed
                clean(str(e))
    finally:
        shim.close()


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rows=st.dictionaries(st.sampled_from(KEYS), attributes, min_size=3, max_size=7))
def test_any_control_rows_leave_every_reader_standing(world, capsys, rows):
    d, store, m = world
    saved = {}
    try:
        for (pk, sk), attrs in rows.items():
            pk = pk.format(id=MID)
            saved[(pk, sk)] = before = store.get(pk, sk)
            d.call("put_item", TableName=store.table, Item={**(before or {}), **attrs, "pk": {"S": pk}, "sk": {"S": sk}})
        drive_readers(d, store, m, capsys)
    finally:
        for (pk, sk), before in saved.items():
            if before is None:
                store.delete(pk, sk)
            else:
                d.call("put_item", TableName=store.table, Item=before)


BOOKKEEPING = ["_rs_v", "_rs_new", "_rs_del", "_rs_src", "temp", "ts", "event_id"]


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(attrs=st.dictionaries(st.sampled_from(BOOKKEEPING), values, min_size=1, max_size=4), which=st.integers(0, 2))
def test_any_data_item_leaves_every_reader_standing(world, capsys, attrs, which):
    d, store, m = world
    mapper = KeyMapper(m)
    fields = to_wire({"sensor_id": "s-1", "event_id": f"e-{which}", "ts": f"2024-10-27T15:0{which}:00Z"})
    key = mapper.old.key(mapper.logical_fields(fields))
    before = d.call("get_item", TableName=m.table, Key=key, ConsistentRead=True).get("Item")
    d.call("put_item", TableName=m.table, Item={**(before or {}), **attrs, **key})
    try:
        drive_readers(d, store, m, capsys)
    finally:
        if before is None:
            d.call("delete_item", TableName=m.table, Key=key)
        else:
            d.call("put_item", TableName=m.table, Item=before)

