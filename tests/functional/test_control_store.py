"""The control store against moto: registration, history, census, acknowledgement, gates."""

from __future__ import annotations

import pathlib
import re

import pytest

from reshard import errors

from reshard.control import records
from reshard.control.store import ControlStore, resolve
from reshard.core.migration import parse
from reshard.core.phases import Action, Phase
from reshard.control.transition import retire, transition
from reshard.control import fleet

ROOT = pathlib.Path(__file__).resolve().parents[2]
SENSOR = (ROOT / "migrations" / "0001_sensor_events.toml").read_text()
MID = "sensor-events-16-to-32"


class FakeClock:
    """Wall time the test controls; ``sleep`` advances it (and counts the calls)."""

    def __init__(self, t: float = 1_000_000.0):
        self.t = t
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def store(moto_dynamo, clock):
    return ControlStore(moto_dynamo, "rs-control", clock=clock)


def migration(text: str = SENSOR, **replace: str):
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    return parse(text, "migrations/test.toml")


def other_migration():
    return migration(**{'id = "sensor-events-16-to-32"': 'id = "sensor-events-16-to-64"',
                        "shards = 32": "shards = 64"})


def test_register_is_idempotent_for_the_same_file(store):
    state, created = store.register(migration(), who="alice@h1")
    assert created and state.phase is Phase.PLANNED and state.phase_version == 1
    again, created = store.register(migration(), who="bob@h2")
    assert not created and again.phase_version == 1 and again.created_by == "alice@h1"
    assert [(t.phase_version, t.to_phase, t.who) for t in store.history(MID)] == [(1, "planned", "alice@h1")]
    assert store.exists() and store.ensure_table() is False  # the table was created once


def test_a_changed_file_under_the_same_id_is_refused_with_a_diff(store):
    store.register(migration())
    with pytest.raises(errors.BadInput) as e:
        store.register(migration(**{"shards = 32": "shards = 48"}))
    msg = str(e.value)
    assert "already registered with a different meaning: to.shards: 32 -> 48." in msg
    assert store.load_state(MID).migration().target.shards == 32  # unchanged


def test_one_active_migration_per_table(store):
    store.register(migration())
    with pytest.raises(errors.BadInput, match=f"already has an active migration '{MID}' \\(in planned\\)"):
        store.register(other_migration())
    transition(store, MID, Action.ABORT, allow_no_shims=True)
    # An aborted migration keeps the table until its cleanup removed the new copies...
    with pytest.raises(errors.BadInput, match="run `reshard cleanup` on it first"):
        store.register(other_migration())
    assert store.active_migration_ids() == [MID]
    retired = retire(store, MID)  # ...which `reshard cleanup` marks by retiring it
    assert retired.retired and retired.phase is Phase.ABORTED and retired.phase_version == 3
    assert [t.action for t in store.history(MID)][-1] == "retire"
    state, created = store.register(other_migration())
    assert created and state.id == "sensor-events-16-to-64"
    assert store.active_migration_ids() == ["sensor-events-16-to-64"]


def test_a_stale_table_lock_is_taken_over(store):
    store.ensure_table()
    # A lock whose owner never got registered (its process died between the two writes).
    store.put({"pk": {"S": "T#SensorEvents"}, "sk": {"S": "ACTIVE"}, "migration_id": {"S": "ghost"}})
    state, created = store.register(migration())
    assert created
    assert store.get("T#SensorEvents", "ACTIVE")["migration_id"]["S"] == MID


def test_history_records_who_when_from_to(store, clock):
    store.register(migration(), who="alice@h1")
    clock.t += 10
    transition(store, MID, Action.ADVANCE, who="bob@h2", allow_no_shims=True)
    clock.t += 5
    transition(store, MID, Action.ADVANCE, who="carol@h3", allow_no_shims=True)
    clock.t += 5
    before, after = transition(store, MID, Action.ROLLBACK, who="alice@h1", allow_no_shims=True)
    assert (before.phase, after.phase, after.phase_version) == (Phase.DUAL_READ, Phase.DUAL_WRITE, 4)
    t0 = 1_000_000.0
    assert [t.as_dict() for t in store.history(MID)] == [
        {"phase_version": 1, "from": "", "to": "planned", "action": "start", "who": "alice@h1", "at": t0},
        {"phase_version": 2, "from": "planned", "to": "dual_write", "action": "advance", "who": "bob@h2", "at": t0 + 10},
        {"phase_version": 3, "from": "dual_write", "to": "dual_read", "action": "advance", "who": "carol@h3",
         "at": t0 + 15},
        {"phase_version": 4, "from": "dual_read", "to": "dual_write", "action": "rollback", "who": "alice@h1",
         "at": t0 + 20},
    ]


def test_a_history_row_lost_to_a_crash_is_recorded_by_the_next_transition(store):
    store.register(migration())
    transition(store, MID, Action.ADVANCE, who="bob@h2", allow_no_shims=True)
    store.delete(store.mpk(MID), "H#00000002")  # as if bob's process died after the compare-and-set
    assert [t.phase_version for t in store.history(MID)] == [1, 2]  # META's copy fills in
    transition(store, MID, Action.ADVANCE, allow_no_shims=True)
    hist = store.history(MID)
    assert [t.phase_version for t in hist] == [1, 2, 3]
    assert (hist[1].who, hist[1].to_phase) == ("bob@h2", "dual_write")
    assert store.get(store.mpk(MID), "H#00000002") is not None


def test_census_and_expiry_follow_the_injected_clock(store, clock):
    store.register(migration())
    fleet.heartbeat(store, MID, "i-1", "planned", 1, liveness_seconds=30, host="h1", pid=11, beat=1)
    assert [h.instance for h in fleet.census(store, MID, 1).live] == ["i-1"]  # the first look: live
    clock.t += 10
    fleet.heartbeat(store, MID, "i-2", "planned", 1, liveness_seconds=30, host="h2", pid=12, beat=1)
    window = 30 + records.ASSUMED_SHIM_REQUEST_SECONDS  # liveness + the longest request in flight
    clock.t += window - 10  # i-1 watched silent for exactly its window: still live
    c = fleet.census(store, MID, 1)
    assert [h.instance for h in c.live] == ["i-1", "i-2"] and c.expired == () and c.acknowledged
    clock.t += 1
    c = fleet.census(store, MID, 1)
    assert [h.instance for h in c.live] == ["i-2"] and [h.instance for h in c.expired] == ["i-1"]
    assert fleet.census(store, MID, 2).lagging[0].describe() == "i-2 (h2 pid 12, on planned v1)"
    fleet.forget(store, MID, "i-2")
    assert fleet.census(store, MID, 2).live == ()


def test_liveness_never_compares_the_shims_clock_with_ours(store, clock, moto_dynamo):
    """Issue 12 point 12: the census watches the beat counter on its own clock. A shim whose
    wall clock is an hour behind ours is live while it beats; one whose clock is an hour
    ahead is dropped once it stopped beating for its window, whatever its stamp says."""
    store.register(migration())
    behind = ControlStore(moto_dynamo, store.table, clock=lambda: clock.t - 3600)
    ahead = ControlStore(moto_dynamo, store.table, clock=lambda: clock.t + 3600)
    fleet.heartbeat(behind, MID, "slow-clock", "planned", 1, liveness_seconds=5, request_seconds=1, beat=1)
    fleet.heartbeat(ahead, MID, "fast-clock", "planned", 1, liveness_seconds=5, request_seconds=1, beat=1)
    assert {h.instance for h in fleet.census(store, MID, 1).live} == {"slow-clock", "fast-clock"}
    for beat in range(2, 6):  # only the slow-clock shim keeps beating, every 3 s
        clock.t += 3
        fleet.heartbeat(behind, MID, "slow-clock", "planned", 1, liveness_seconds=5, request_seconds=1, beat=beat)
        c = fleet.census(store, MID, 1)
        assert "slow-clock" in {h.instance for h in c.live}
    assert [h.instance for h in c.expired] == ["fast-clock"]  # silent 12 s > 5 + 1


def test_advance_is_refused_while_a_shim_lags_and_allowed_once_it_acknowledges(store, clock):
    store.register(migration())
    fleet.heartbeat(store, MID, "i-1", "planned", 1, host="h1", pid=7)
    transition(store, MID, Action.ADVANCE, allow_no_shims=True)  # the fleet acknowledged v1
    with pytest.raises(errors.RefusedTransition) as e:
        transition(store, MID, Action.ADVANCE, allow_no_shims=True)
    assert not isinstance(e.value, errors.ConcurrentChange)
    assert "1 live shim(s) have not acknowledged dual_write yet: i-1 (h1 pid 7, on planned v1)" in str(e.value)
    assert store.load_state(MID).phase is Phase.DUAL_WRITE
    fleet.heartbeat(store, MID, "i-1", "dual_write", 2, host="h1", pid=7)
    _, after = transition(store, MID, Action.ADVANCE, allow_no_shims=True)
    assert after.phase is Phase.DUAL_READ


def test_rollback_and_abort_also_wait_for_the_fleet(store):
    store.register(migration())
    transition(store, MID, Action.ADVANCE, allow_no_shims=True)
    fleet.heartbeat(store, MID, "i-1", "planned", 1)
    for action in (Action.ROLLBACK, Action.ABORT):
        with pytest.raises(errors.RefusedTransition, match=f"reshard {action.value} --wait"):
            transition(store, MID, action, allow_no_shims=True)


def test_an_expired_heartbeat_drops_out_and_stops_blocking(store, clock):
    store.register(migration())
    fleet.heartbeat(store, MID, "i-gone", "planned", 0, liveness_seconds=5)
    with pytest.raises(errors.RefusedTransition, match="i-gone"):
        transition(store, MID, Action.ADVANCE, allow_no_shims=True)
    clock.t += 5 + records.ASSUMED_SHIM_REQUEST_SECONDS + 0.1  # watched silent long enough
    _, after = transition(store, MID, Action.ADVANCE, allow_no_shims=True)
    assert after.phase is Phase.DUAL_WRITE


def test_no_shims_means_immediate_acknowledgement(store, clock):
    store.register(migration())
    c = fleet.wait_for_ack(store, MID, 1, seconds=60, sleep=clock.sleep)
    assert c.acknowledged and c.live == () and clock.sleeps == []


def test_wait_for_ack_returns_when_the_laggard_catches_up(store, clock):
    store.register(migration())
    fleet.heartbeat(store, MID, "i-1", "planned", 0)

    def sleep(seconds):
        clock.sleep(seconds)
        if len(clock.sleeps) == 3:  # the shim refreshes during our third nap
            fleet.heartbeat(store, MID, "i-1", "planned", 1)

    c = fleet.wait_for_ack(store, MID, 1, seconds=60, sleep=sleep, poll=1.0)
    assert c.acknowledged and len(clock.sleeps) == 3


def test_wait_for_ack_gives_up_at_the_deadline_with_the_laggards(store, clock):
    store.register(migration())
    fleet.heartbeat(store, MID, "i-1", "planned", 0, liveness_seconds=600)
    c = fleet.wait_for_ack(store, MID, 1, seconds=2.5, sleep=clock.sleep, poll=1.0)
    assert not c.acknowledged and [h.instance for h in c.lagging] == ["i-1"]
    assert clock.sleeps == [1.0, 1.0, 0.5]


def test_wait_for_ack_sees_a_laggard_expire(store, clock):
    store.register(migration())
    fleet.heartbeat(store, MID, "i-1", "planned", 0, liveness_seconds=5)
    c = fleet.wait_for_ack(store, MID, 1, seconds=60, sleep=clock.sleep, poll=2.0)
    assert c.acknowledged and [h.instance for h in c.expired] == ["i-1"]
    assert 5 + records.ASSUMED_SHIM_REQUEST_SECONDS <= sum(clock.sleeps) <= 5 + records.ASSUMED_SHIM_REQUEST_SECONDS + 2
    assert fleet.heartbeats(store, MID) == []  # the wait removed the row it watched go silent


def test_reaping_keeps_a_row_that_beat_again(store, clock):
    store.register(migration())
    fleet.heartbeat(store, MID, "i-1", "planned", 0, beat=1)
    gone, = fleet.heartbeats(store, MID)
    clock.t += 1
    fleet.heartbeat(store, MID, "i-1", "planned", 0, beat=2)  # it beat after we judged it
    assert fleet.reap(store, MID, [gone]) == 0
    assert [h.beat for h in fleet.heartbeats(store, MID)] == [2]


def _walk_to(store, phase):
    while store.load_state(MID).phase is not phase:
        transition(store, MID, Action.ADVANCE, allow_no_shims=True)


def test_gates_are_passed_in(store):
    store.register(migration())
    _walk_to(store, Phase.BACKFILL)
    with pytest.raises(errors.RefusedTransition, match="the backfill has not run.*no verify yet"):
        transition(store, MID, Action.ADVANCE, allow_no_shims=True)
    calls = []

    def fake_gates(st, state):
        calls.append((st, state.phase))
        return {"backfill_missing": None, "verify_missing": None, "cleanup_missing": "3 segments left: run cleanup"}

    _, after = transition(store, MID, Action.ADVANCE, gates=fake_gates, allow_no_shims=True)
    assert after.phase is Phase.CUTOVER and calls[-1] == (store, Phase.BACKFILL)
    # The catch-up flag (docs/late-writes.md) is the rules' own, not a gate: clear it as the
    # passing verify after the switch would.
    assert store.clear_newer_may_be(after, "setup")
    transition(store, MID, Action.ADVANCE, gates=fake_gates, allow_no_shims=True)
    with pytest.raises(errors.RefusedTransition, match="3 segments left: run cleanup"):
        transition(store, MID, Action.ADVANCE, gates=fake_gates, allow_no_shims=True)
    with pytest.raises(errors.RefusedTransition, match="rollback is refused in cleanup"):
        transition(store, MID, Action.ROLLBACK, gates=fake_gates, allow_no_shims=True)


def test_gates_passed_to_one_transition_do_not_outlive_it(store):
    """No registry: open gates given to one call leave the next call to the run records."""
    store.register(migration())
    _walk_to(store, Phase.BACKFILL)
    opened = lambda st, state: {"backfill_missing": None, "verify_missing": None, "cleanup_missing": None}
    transition(store, MID, Action.ADVANCE, gates=opened, allow_no_shims=True)
    transition(store, MID, Action.ROLLBACK, allow_no_shims=True)
    with pytest.raises(errors.RefusedTransition, match="the backfill has not run"):
        transition(store, MID, Action.ADVANCE, allow_no_shims=True)


def test_expected_version_pins_the_state_we_acted_on(store):
    store.register(migration(), who="alice@h1")
    transition(store, MID, Action.ADVANCE, who="bob@h2", allow_no_shims=True)
    with pytest.raises(errors.ConcurrentChange) as e:
        transition(store, MID, Action.ADVANCE, expected_version=1, allow_no_shims=True)
    assert re.fullmatch(rf"bob@h2 already moved it from planned to dual_write at \S+Z; nothing done: '{MID}' is in "
                        r"dual_write \(phase version 2\); check `reshard status`, then run the command again if "
                        r"you still mean it from there", str(e.value)), str(e.value)


def test_a_lost_compare_and_set_names_the_winner(store, moto_dynamo):
    """The loser read the state, then someone else wrote before its conditional update."""
    store.register(migration())
    rival = ControlStore(moto_dynamo.__class__(region="us-east-1"), store.table)
    fired = []

    def rival_moves_first(**kwargs):
        if not fired:
            fired.append(True)
            transition(rival, MID, Action.ADVANCE, who="rival@h9", allow_no_shims=True)

    moto_dynamo.client.meta.events.register("before-call.dynamodb.UpdateItem", rival_moves_first)
    with pytest.raises(errors.ConcurrentChange, match=r"rival@h9 already moved it from planned to dual_write .* nothing done"):
        transition(store, MID, Action.ADVANCE, who="me@h1", allow_no_shims=True)
    hist = store.history(MID)
    assert [t.phase_version for t in hist] == [1, 2] and (hist[1].who, hist[1].to_phase) == ("rival@h9", "dual_write")


def test_a_missing_control_table_is_one_clear_error(store):
    for call in (lambda: store.load_state(MID), lambda: resolve(store, None),
                 lambda: store.history(MID)):
        with pytest.raises(errors.MigrationNotFound, match="control table 'rs-control' does not exist"):
            call()


def test_an_unknown_migration_is_named(store):
    store.ensure_table()
    with pytest.raises(errors.MigrationNotFound, match="no migration 'nope'"):
        store.load_state("nope")
    with pytest.raises(errors.MigrationNotFound, match="no active migration"):
        resolve(store, None)


def test_resolve_by_file_id_or_the_only_active_one(store, tmp_path):
    store.register(migration())
    f = tmp_path / "m.toml"
    f.write_text(SENSOR)
    assert resolve(store, str(f)) == MID == resolve(store, MID) == resolve(store, None)


def test_permission_to_create_the_control_table_is_explained(store, moto_dynamo):
    from botocore.awsrequest import AWSResponse

    class Raw:
        def stream(self, **_):
            yield b""

    def deny(**kwargs):
        body = b'{"__type":"com.amazonaws.dynamodb.v20120810#AccessDeniedException","message":"not allowed"}'
        r = AWSResponse("https://x", 400, {"x-amzn-requestid": "req-1"}, Raw())
        r._content = body
        return r

    moto_dynamo.client.meta.events.register("before-send.dynamodb.CreateTable", deny)
    with pytest.raises(errors.AccessDenied) as e:
        store.ensure_table()
    assert "cannot create control table 'rs-control': not allowed (grant dynamodb:CreateTable" in str(e.value)
    assert e.value.exit_code == 1 and e.value.request_id == "req-1"


# ---------------------------------------------------------------------------- rows reshard did not write

@pytest.mark.parametrize("forged, says", [
    ({"instance": {"S": "i-1"}, "phase_version": {"N": "9"}}, "says instance 'i-1' but sits under 'i-2'"),
    ({"instance": {"S": "i-2"}, "schema": {"N": "2"}}, "schema '2'"),
    ({"instance": {"S": "i-2"}, "pid": {"S": "12"}}, "attribute 'pid' is 'S'"),  # a mistyped attribute
    ({"instance": {"S": "i-2"}, "host": {"S": "evil\x1b]0;owned\x07"}, "beat": {"L": []}}, "attribute 'beat'"),
])
def test_a_forged_heartbeat_holds_the_fleet_back_by_name_until_it_stays_unchanged(moto_dynamo, clock, forged, says):
    """An app may write its migration's heartbeat partition (IAM cannot limit the sort key). A
    row there that names another instance, has an unknown schema or an attribute of another
    type is never skipped (fail closed: a newer release's shim may have written it) and never
    crashes the census (it once raised KeyError): it counts as an unreadable shim lagging every
    version, named in the refusal, until its content stayed unchanged for the longest silence
    a shim may have (decode's bounds); then a wait removes it, conditioned on that content."""
    from reshard.core.decode import MAX_LIVENESS_SECONDS, MAX_REQUEST_SECONDS
    store = ControlStore(moto_dynamo, "ctl", clock=clock)
    store.register(parse(SENSOR, "<sensor>"))
    fleet.heartbeat(store, MID, "i-1", "planned", 1)
    assert [h.instance for h in fleet.census(store, MID, 1).live] == ["i-1"]
    store.dynamo.call("put_item", TableName="ctl", Item={"pk": {"S": store.hpk(MID)}, "sk": {"S": "S#i-2"}, **forged})
    c = fleet.census(store, MID, 1)
    (bad,) = [h for h in c.lagging if h.unreadable]
    assert bad.instance == "i-2" and says in bad.unreadable and "\x1b" not in " ".join(c.describe_lagging())
    with pytest.raises(errors.RefusedTransition, match="unreadable heartbeat row"):
        transition(store, MID, Action.ADVANCE)
    assert store.load_state(MID).phase is Phase.PLANNED
    # Rewritten (as a live writer would): watched afresh. Left alone: gone after the bound.
    fleet.heartbeat(store, MID, "i-1", "planned", 1)
    clock.t += MAX_LIVENESS_SECONDS + MAX_REQUEST_SECONDS + 1
    fleet.heartbeat(store, MID, "i-1", "planned", 1)
    c = fleet.wait_for_ack(store, MID, 1, 0, sleep=clock.sleep)
    assert c.acknowledged and [h.instance for h in c.live] == ["i-1"]
    assert store.get(store.hpk(MID), "S#i-2") is None  # removed: the next command does not watch it again


def test_a_meta_row_outside_the_migration_partitions_is_no_migration(moto_dynamo, clock):
    """A "META" an app wrote in its heartbeat partition must not pass for a migration."""
    store = ControlStore(moto_dynamo, "ctl", clock=clock)
    state, _ = store.register(parse(SENSOR, "<sensor>"))
    forged = dict(state.raw, pk={"S": store.hpk(MID)}, id={"S": "evil"}, table={"S": "Other"})
    store.dynamo.call("put_item", TableName="ctl", Item=forged)
    assert [s.id for s in store.list_states()] == [MID]
    assert resolve(store, None) == MID


def test_a_meta_row_of_an_unknown_schema_is_refused_with_one_line(moto_dynamo, clock, capsys):
    from reshard.cli.main import main

    store = ControlStore(moto_dynamo, "ctl", clock=clock)
    store.register(parse(SENSOR, "<sensor>"))
    store.update(store.mpk(MID), "META", "SET #s = :s", names={"#s": "schema"}, values={":s": {"N": "3"}})
    assert main(["status", MID, "--control-table", "ctl"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "schema '3'" in err and "refusing to act on it" in err


def test_a_heartbeat_where_an_older_release_wrote_it_is_counted_and_reaped_there(moto_dynamo, clock):
    """Heartbeats moved from M#<id> to S#<id>: a shim not yet upgraded must still hold the fleet."""
    store = ControlStore(moto_dynamo, "ctl", clock=clock)
    store.register(parse(SENSOR, "<sensor>"))
    store.put({"pk": {"S": store.mpk(MID)}, "sk": {"S": "S#old"}, "instance": {"S": "old"},
               "phase": {"S": "planned"}, "phase_version": {"N": "0"}, "at": {"N": str(clock())},
               "liveness_seconds": {"N": "5"}, "beat": {"N": "1"}})
    fleet.heartbeat(store, MID, "new", "planned", 1, liveness_seconds=5)
    c = fleet.census(store, MID, 1)
    assert sorted(h.instance for h in c.live) == ["new", "old"] and [h.instance for h in c.lagging] == ["old"]
    with pytest.raises(errors.RefusedTransition):
        transition(store, MID, Action.ADVANCE)
    clock.t += 100
    c = fleet.wait_for_ack(store, MID, 1, 60, sleep=clock.sleep)
    assert c.live == () and {h.instance for h in c.expired} == {"old", "new"}
    assert store.get(store.mpk(MID), "S#old") is None and store.get(store.hpk(MID), "S#new") is None  # reaped where each was
