"""One control row cannot block, crash or deceive the fleet (issue 30, case 4), through the CLI on moto.

* A heartbeat an app wrote with ``liveness_seconds = 1E+125`` (and ``request_seconds``,
  ``write_seconds``, ``refresh_seconds`` as large) asks for waits clamped to the documented
  maxima (reshard.core.decode): advance --wait and doctor --repair watch it silent and remove
  it after 600 + 300 s, verify's settle window is at most 1200 s, a switch waits at most a
  refresh of 600 s. Before: never silent, never removed, an endless settle window.
* A mistyped attribute (``pid`` as S, anything) never crashes status, advance or doctor (it
  raised "internal error: KeyError"): status shows the row as UNREADABLE, advance is refused
  naming it, doctor lists it as ``foreign_row``. Job rows the same: one clear line.
* ``host``/``instance`` holding escape sequences reach the terminal escaped, in every output.
* The census reads only heartbeat rows: a wait's polls send no Scan, whatever an app stuffs
  into its partition (benchmarks/census.py measures the difference).
"""

from __future__ import annotations

import json
import pathlib

import pytest

from reshard.cli.main import main
from reshard.control import fleet
from reshard.control.records import jobs_pk, run_sk, segment_sk
from reshard.control.store import ControlStore
from reshard.core import decode
from reshard.core.settle import settle_window

from tests.functional.test_control_store import FakeClock as Clock
from tests.functional.test_phase_cli import CT, MID, SENSOR_FILE, make_table

pytestmark = pytest.mark.functional

HUGE = "1E+125"
ESC = "\x1b]0;owned\x07\x1b[2J"


@pytest.fixture
def store(moto_dynamo):
    make_table(moto_dynamo, "SensorEvents")
    assert main(["start", SENSOR_FILE, *CT]) == 0
    return ControlStore(moto_dynamo, "rs-control")


def put_row(store: ControlStore, pk: str, sk: str, **attrs) -> None:
    store.dynamo.call("put_item", TableName=store.table, Item={"pk": {"S": pk}, "sk": {"S": sk}, **attrs})


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main([*args, *CT])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_heartbeat_asking_for_endless_waits_is_clamped_watched_silent_and_removed(store):
    put_row(store, f"S#{MID}", "S#greedy", instance={"S": "greedy"}, phase={"S": "planned"},
            phase_version={"N": "0"}, beat={"N": "1"}, at={"N": "1"}, liveness_seconds={"N": HUGE},
            request_seconds={"N": HUGE}, write_seconds={"N": HUGE}, refresh_seconds={"N": HUGE}, pid={"N": "4"})
    (h,) = fleet.heartbeats(store, MID)
    assert h.silence_seconds == decode.MAX_LIVENESS_SECONDS + decode.MAX_REQUEST_SECONDS
    assert settle_window([h.settle_seconds]) == decode.MAX_WRITE_SECONDS
    assert h.refresh_seconds == decode.MAX_LIVENESS_SECONDS
    clock = Clock()
    watcher = ControlStore(store.dynamo, store.table, clock=clock)
    c = fleet.wait_for_ack(watcher, MID, 1, 2 * h.silence_seconds, sleep=clock.sleep, poll=60)
    assert c.acknowledged and clock.t - 1_000_000.0 <= h.silence_seconds + 60  # watched, not waited forever
    assert fleet.heartbeats(store, MID) == []  # removed: the next command does not watch it again


@pytest.mark.parametrize("attrs, says", [
    ({"pid": {"S": "12"}}, "attribute 'pid' is 'S'"),
    ({"beat": {"BOOL": True}}, "attribute 'beat' is 'BOOL'"),
    ({"phase_version": {"SS": ["1"]}}, "attribute 'phase_version' is 'SS'"),
    ({"host": {"M": {}}}, "attribute 'host' is 'M'"),
])
def test_a_mistyped_heartbeat_never_crashes_status_advance_or_doctor(store, capsys, attrs, says):
    put_row(store, f"S#{MID}", "S#typo", instance={"S": "typo"}, phase={"S": "planned"}, **attrs)
    code, out, err = cli(capsys, "status", MID)
    assert code == 0 and "internal error" not in err
    assert "typo" in out and "UNREADABLE" in out and "LAGGING" in out
    assert json.loads(cli(capsys, "status", MID, "--output", "json")[1])["shims"][0]["unreadable"]
    code, out, err = cli(capsys, "advance", MID)
    assert code == 2 and "unreadable heartbeat row" in err and says in err and "internal error" not in err
    code, out, err = cli(capsys, "doctor", MID, "--output", "json")
    assert "internal error" not in err
    found = [f for f in json.loads(out)["findings"] if f["kind"] == "foreign_row"]
    assert len(found) == 1 and "S#typo" in found[0]["subject"] and says in found[0]["detail"]


def test_escape_sequences_in_a_heartbeat_reach_no_terminal_raw(store, capsys):
    fleet.heartbeat(store, MID, f"i-{ESC}", "planned", 0, host=f"host{ESC}\nFAKE LINE", pid=3)
    for output in ("text", "table", "json"):
        code, out, err = cli(capsys, "status", MID, "--output", output)
        assert code == 0 and "\x1b" not in out + err and "\x07" not in out + err, output
        assert "\\x1b" in out or "\\u001b" in out, output  # shown, escaped
    code, out, err = cli(capsys, "advance", MID)
    assert code == 2 and "\x1b" not in out + err and "\\x1b" in err
    code, out, err = cli(capsys, "doctor", MID)
    assert "\x1b" not in out + err


def test_mistyped_job_rows_are_one_clear_line_for_status_and_the_gates(store, capsys):
    pk = jobs_pk(MID, "backfill")
    put_row(store, pk, run_sk("backfill", 1), job={"S": "backfill"}, total_segments={"S": "two"})
    code, out, err = cli(capsys, "status", MID)
    assert code == 2 and "attribute 'total_segments' is 'S'" in err and "internal error" not in err
    assert len(err.strip().splitlines()) == 1
    store.delete(pk, run_sk("backfill", 1))
    put_row(store, pk, run_sk("backfill", 1), job={"S": "backfill"}, total_segments={"N": "1"},
            started_at={"N": "1"})
    put_row(store, pk, segment_sk("backfill", 1, 0), owner={"S": "h:1:x"}, lease_counter={"N": "1"},
            lease_seconds={"N": HUGE}, checkpoint={"S": "{not json"})
    code, out, err = cli(capsys, "status", MID)
    assert code == 2 and "checkpoint" in err and "internal error" not in err
    code, out, err = cli(capsys, "doctor", MID, "--output", "json")
    assert "internal error" not in err, err
    assert any(f["kind"] == "foreign_row" for f in json.loads(out)["findings"]), (out, err)


def test_a_wait_polls_only_the_heartbeat_rows_whatever_the_app_stuffs_into_its_partition(store):
    """Before: every poll Scanned the whole control table (ConsistentRead), junk included."""
    for i in range(60):
        put_row(store, f"S#{MID}", f"junk-{i:04d}", blob={"S": "x" * 2000})  # outside S#: no heartbeat
    fleet.heartbeat(store, MID, "i-1", "planned", 0, pid=1)
    sent: list[tuple[str, int]] = []

    def count(http_response=None, parsed=None, model=None, **_):
        sent.append((model.name, len(parsed.get("Items", ()))))

    store.dynamo.client.meta.events.register("after-call.dynamodb", count)
    clock = Clock()
    watcher = ControlStore(store.dynamo, store.table, clock=clock)
    fleet.wait_for_ack(watcher, MID, 1, 5, sleep=clock.sleep, poll=1)
    polls = [s for s in sent if s[0] == "Query"]
    assert len(polls) >= 10  # it polled (two partitions a poll) ...
    assert [s for s in sent if s[0] == "Scan"] == [("Scan", 1)]  # ... after one look for other migrations
    assert max(n for _, n in polls) <= 1  # and read no junk row


def test_a_rewrite_between_the_look_and_the_removal_keeps_an_unreadable_row(store):
    """Forced interleaving: a wait watched an unreadable heartbeat row unchanged past the bound
    and removes it; its writer rewrites it between the census's read and the delete. The
    delete is conditioned on the content read, so the rewritten row stays (and counts again)."""
    put_row(store, f"S#{MID}", "S#odd", instance={"S": "odd"}, pid={"S": "x"}, beat={"N": "1"})
    clock = Clock()
    watcher = ControlStore(store.dynamo, store.table, clock=clock)
    fleet.census(watcher, MID, 1)  # the first look starts the watch
    clock.t += decode.MAX_LIVENESS_SECONDS + decode.MAX_REQUEST_SECONDS + 1
    delete = watcher.delete

    def rewritten_first(pk, sk, **kw):
        if sk == "S#odd":
            put_row(store, f"S#{MID}", "S#odd", instance={"S": "odd"}, pid={"S": "x"}, beat={"N": "2"})
        return delete(pk, sk, **kw)

    watcher.delete = rewritten_first
    c = fleet.census(watcher, MID, 1)
    assert [h.instance for h in c.expired] == ["odd"]
    assert fleet.reap(watcher, MID, c.expired) == 0
    (h,) = fleet.heartbeats(store, MID)
    assert h.unreadable and h.raw["beat"] == {"N": "2"}  # the rewrite stayed
