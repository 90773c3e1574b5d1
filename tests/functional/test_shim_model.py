"""Model-based test: two shim instances on (adjacent, changing) phases and a stand-in
backfill, interleaved at the granularity of single DynamoDB calls.

Every operation (a shim put/update/delete, a copy step) runs in its own thread; a
scheduled Dynamo makes each thread wait before every call until the test grants it,
so hypothesis chooses the interleaving -- including between a shim's authoritative and
mirror writes, and between the copy's write, read-back and fix-up. Only one call runs
at a time, which keeps moto deterministic.

Fleet rules modelled (from reshard.core.phases): an instance acknowledges the control phase
only when it has no request in flight; a transition needs every instance on the current
phase; a transition that changes authority (``backfill <-> cutover``) is a switch: shims
that see it hold (start no request) until every shim holds, then all move on (or the
switch is abandoned and they go back); copies run only in ``backfill`` with the whole
fleet there; ``backfill -> cutover`` needs a full copy pass that started after the fleet
reached ``backfill``.

Invariants after draining and a final copy pass: one physical item per logical item per
layout, both layouts agree (same version, same content), and each logical item equals
the result of a write that no other write on it followed (deleted stays deleted).
"""

from __future__ import annotations

import threading
import uuid

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from reshard.aws.dynamo import Dynamo, RetryPolicy
from reshard.core.layout import NEW_COPY_ATTR, KeyMapper, is_tombstone
from reshard.core.phases import Phase, changes_authority
from reshard.core.versions import VersionClock, version_of
from tests.copy_model import copy_items
from tests.shim_helpers import by_layout, create_table, migration, scan, shim

PHASES = [Phase.PLANNED, Phase.DUAL_WRITE, Phase.DUAL_READ, Phase.BACKFILL, Phase.CUTOVER]
_local = threading.local()


class Scheduler:
    """Runs tasks in threads, one DynamoDB call at a time, in the order the test picks."""

    def __init__(self):
        self.cv = threading.Condition()
        self.tasks: list[Task] = []

    def start(self, task: "Task") -> None:
        self.tasks.append(task)
        task.thread.start()
        self._settle(task)

    def step(self, task: "Task") -> None:
        with self.cv:
            task.state = "running"
        task.go.set()
        self._settle(task)

    def _settle(self, task: "Task") -> None:
        with self.cv:
            assert self.cv.wait_for(lambda: task.state != "running", timeout=30), f"{task.name} hung"

    def ready(self) -> list["Task"]:
        return [t for t in self.tasks if t.state == "ready"]


class Task:
    def __init__(self, sched: Scheduler, name: str, fn, **info):
        self.sched, self.name, self.fn, self.info = sched, name, fn, info
        self.state = "running"
        self.go = threading.Event()
        self.result = None
        self.exc: BaseException | None = None
        self.auth_version: str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        _local.task = self
        try:
            self.result = self.fn()
        except BaseException as e:  # reported by the test
            self.exc = e
        finally:
            with self.sched.cv:
                self.state = "done"
                self.sched.cv.notify_all()

    def wait_turn(self) -> None:
        with self.sched.cv:
            self.state = "ready"
            self.sched.cv.notify_all()
        self.go.wait()
        self.go.clear()


class ScheduledDynamo(Dynamo):
    """Every call from a task thread waits for its turn."""

    def call(self, operation: str, **kwargs) -> dict:
        task = getattr(_local, "task", None)
        if task is not None:
            task.wait_turn()
        resp = super().call(operation, **kwargs)
        if task is not None and task.auth_version is None:
            # The first successful write of a shim operation is its authoritative write.
            if operation == "put_item" and "_rs_v" in kwargs["Item"]:
                task.auth_version = kwargs["Item"]["_rs_v"]["S"]
            elif operation == "update_item" and ":rs_nv" in kwargs.get("ExpressionAttributeValues", {}):
                task.auth_version = kwargs["ExpressionAttributeValues"][":rs_nv"]["S"]
        return resp


@pytest.fixture(scope="module")
def moto_env():
    from moto import mock_aws
    with mock_aws():
        yield ScheduledDynamo(region="us-east-1", retry=RetryPolicy(max_attempts=2, base_seconds=0.001))


KEYS = 3


def logical_key(name: str, k: int) -> dict:
    if name == "sensor":
        return {"sensor_id": "s-1", "event_id": f"e-{k}", "ts": f"2024-10-27T15:0{k}:00Z"}
    if name == "invoices":
        return {"invoice_number": str(121210 + k), "line": f"{k:03d}"}
    return {"sensor_id": f"s-{k}", "ts": f"2024-10-27T15:0{k}:00Z"}


def seed(dynamo, m, mapper: KeyMapper, name: str, ks: list[int]) -> None:
    """Pre-migration items: old layout, no version (a random layout: a random-looking shard)."""
    for k in ks:
        logical = {**logical_key(name, k), "val": "seed"}
        if name == "hourly":
            logical["event_id"] = f"e-{k}"
        wire = __import__("reshard.aws.dynamo", fromlist=["to_wire"]).to_wire(logical)
        shard = (k * 7 + 3) % mapper.old.shards if mapper.old.random else None
        item = dict(wire)
        item.update(mapper.old.key(mapper.logical_fields(wire), shard))
        dynamo.call("put_item", TableName=m.table, Item=item)


@pytest.mark.parametrize("name", ["sensor", "invoices", "hourly"])
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.data())
def test_interleavings_converge(moto_env, name, data):
    dynamo = moto_env
    m = migration(name, table=f"model-{uuid.uuid4().hex[:8]}")
    create_table(dynamo, m)
    mapper = KeyMapper(m)
    seeded = data.draw(st.lists(st.integers(0, KEYS - 1), unique=True, max_size=KEYS), label="seeded")
    seed(dynamo, m, mapper, name, seeded)
    seed_value = {k: {**logical_key(name, k), "val": "seed", **({"event_id": f"e-{k}"} if name == "hourly" else {})}
                  for k in seeded}

    c = data.draw(st.integers(0, 3), label="start phase")
    phases = {"a": PHASES[c], "b": PHASES[c]}
    # Deterministic clocks (hypothesis replays must repeat exactly); b's clock lags a's
    # by a drawn skew, so fence losses and retries above the observed version happen.
    skew = data.draw(st.integers(0, 40), label="skew")
    now = [1_700_000_000_000]
    clocks = {"a": VersionClock("a", lambda: now[0]), "b": VersionClock("b", lambda: now[0] - skew)}
    shims = {i: shim(m, dynamo, PHASES[c], writer_id=i, query_workers=1, version_clock=clocks[i]) for i in "ab"}
    sched = Scheduler()
    clock = [0]
    history: list[dict] = []  # one entry per shim write: key, start, end, result
    copy_started_ok = [False]
    counter = [0]

    def tick() -> int:
        clock[0] += 1
        return clock[0]

    def in_flight(inst=None):
        return [t for t in sched.tasks if t.state != "done" and (inst is None or t.info.get("inst") == inst)]

    def start_op(inst: str, kind: str, k: int) -> None:
        t = shims[inst]
        key = logical_key(name, k)
        counter[0] += 1
        val = f"{inst}{counter[0]}"
        rec = {"key": k, "start": tick(), "end": None, "kind": kind, "task": None}
        history.append(rec)

        def run():
            if kind == "put":
                item = {**key, "val": val, **({"event_id": f"e-{k}"} if name == "hourly" else {})}
                t.put_item(Item=item)
                return item
            if kind == "update":
                r = t.update_item(Key=key, UpdateExpression="SET #v = :v ADD #n :one",
                                  ExpressionAttributeNames={"#v": "val", "#n": "n"},
                                  ExpressionAttributeValues={":v": val, ":one": 1}, ReturnValues="ALL_NEW")
                return r["Attributes"]
            t.delete_item(Key=key)
            return None

        def wrapped():
            out = run()
            rec["result"] = out
            rec["end"] = tick()
            return out

        task = Task(sched, f"{inst}:{kind}:{k}", wrapped, inst=inst)
        rec["task"] = task
        sched.start(task)

    def start_copy(full_pass_counts: bool) -> None:
        def run():
            items = scan(dynamo, m.table)
            old_items = [i for i in items if _genuine_old(mapper, i)]
            copy_items(dynamo, m.table, mapper, old_items)
            if full_pass_counts:
                copy_started_ok[0] = True

        sched.start(Task(sched, "copy", run, inst="copy"))

    # The authority switch (backfill <-> cutover): the control row first says "switching";
    # a shim that refreshes then holds (starts no request) until the switch is finished,
    # which needs every shim holding with nothing in flight; or the switch is abandoned.
    switching, previous = False, c
    for _ in range(data.draw(st.integers(5, 30), label="steps")):
        cphase = PHASES[c]
        want = "hold" if switching else cphase
        actions = [f"op_{i}" for i in "ab" if phases[i] != "hold"]
        if sched.ready():
            actions += ["step"] * 3
        for i in "ab":
            if phases[i] != want and not in_flight(i):
                actions.append(f"refresh_{i}")
        if switching:
            if all(p == "hold" for p in phases.values()) and not in_flight("a") and not in_flight("b"):
                actions.append("finish_switch")
            actions.append("abandon_switch")
        fleet_on_c = not switching and all(p == cphase for p in phases.values())
        if fleet_on_c and not in_flight("copy"):
            if c + 1 < len(PHASES) and (cphase != Phase.BACKFILL or copy_started_ok[0]):
                actions.append("advance")
            if c > 0:
                actions.append("rollback")
        if cphase == Phase.BACKFILL and fleet_on_c and not in_flight("copy") and \
                all(t.info.get("phase", cphase) == cphase for t in in_flight()):
            actions.append("copy")
        if not actions:
            break
        action = data.draw(st.sampled_from(actions), label="action")
        now[0] += data.draw(st.integers(0, 10), label="ms")
        if action.startswith("op_"):
            inst = action[-1]
            if len(in_flight(inst)) >= 2:
                continue
            kind = data.draw(st.sampled_from(["put", "update", "delete"]), label="kind")
            k = data.draw(st.integers(0, KEYS - 1), label="key")
            start_op(inst, kind, k)
            sched.tasks[-1].info["phase"] = phases[inst]
        elif action == "step":
            ready = sched.ready()
            sched.step(data.draw(st.sampled_from(ready), label="which"))
        elif action.startswith("refresh_"):
            i = action[-1]
            phases[i] = want
            if want != "hold":
                shims[i]._pin_phase(cphase)
        elif action == "finish_switch":
            switching = False
        elif action == "abandon_switch":
            switching = False
            c = previous
        elif action in ("advance", "rollback"):
            previous = c
            c += 1 if action == "advance" else -1
            switching = changes_authority(PHASES[previous], PHASES[c])
            if action == "rollback" and PHASES[c] == Phase.PLANNED:
                copy_started_ok[0] = False  # planned writes the old layout only: the copy is stale
        elif action == "copy":
            start_copy(full_pass_counts=True)

    # Drain: finish every in-flight task (in a drawn order), then a final copy pass.
    for _ in range(10_000):
        ready = sched.ready()
        if not ready:
            break
        sched.step(data.draw(st.sampled_from(ready), label="drain"))
    for task in sched.tasks:
        assert task.state == "done"
        if task.exc is not None:
            raise task.exc
    if not copy_started_ok[0]:
        # No full backfill pass since the fleet last wrote the old layout only: copy now.
        # (After a full pass no copy is needed: dual writes alone must keep the layouts equal.)
        items = scan(dynamo, m.table)
        copy_items(dynamo, m.table, mapper, [i for i in items if _genuine_old(mapper, i)])

    # Invariants.
    items = scan(dynamo, m.table)
    layouts = by_layout(mapper, items)
    for k in range(KEYS):
        ident = mapper.identity(mapper.logical_fields(logical_key(name, k)))
        old = _genuine(mapper, layouts["old"].get(ident, []))
        new = layouts["new"].get(ident, [])
        assert len(old) <= 1 and len(new) <= 1, f"key {k}: duplicates old={old} new={new}"
        o = old[0] if old else None
        n = new[0] if new else None
        assert _state(o) == _state(n), f"key {k}: layouts differ\nold={o}\nnew={n}"
        final = shims["a"]._to_app(o, mapper.old) if o is not None else None
        writes = [h for h in history if h["key"] == k]
        allowed = [h["result"] for h in writes if not any(o2["start"] > h["end"] for o2 in writes)]
        if not writes:
            allowed = [seed_value.get(k)]
        assert final in allowed, f"key {k}: final {final} not among last writes {allowed}"
        if writes:
            # Versions order writes: the item is the newest acknowledged write, exactly.
            top = max(writes, key=lambda h: h["task"].auth_version)
            assert version_of(o) == top["task"].auth_version, f"key {k}: {o} is not the newest write {top}"
            assert final == top["result"], f"key {k}: final {final} != newest write's result {top['result']}"
    for t in shims.values():
        t.close()


def _state(item):
    if item is None:
        return None
    return (version_of(item),
            is_tombstone(item) or {k: v for k, v in item.items() if k not in ("PK", "SK", NEW_COPY_ATTR)})


def _genuine_old(mapper: KeyMapper, item: dict) -> bool:
    """An item of the old layout (not the new layout's marked copy of an item)."""
    if mapper.is_new_copy(item):
        return False
    try:
        fields = mapper.fields(item, mapper.old)
    except Exception:
        return False
    key = {a: item[a] for a in mapper.old.key_attrs}
    return mapper.old.random or mapper.old.key(fields) == key


def _genuine(mapper: KeyMapper, items: list[dict]) -> list[dict]:
    return [i for i in items if not mapper.is_new_copy(i)]
