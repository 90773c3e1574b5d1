"""ShardedTable under threads against dynalite: read-your-writes in every phase, and two
instances on adjacent phases writing the same keys at once."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest

from reshard.aws.dynamo import Dynamo, RetryPolicy
from reshard.core.layout import KeyMapper
from tests.shim_helpers import by_layout, create_table, migration, scan, shim

PHASES = [None, "planned", "dual_write", "dual_read", "backfill", "cutover", "cleanup", "complete", "aborted"]


class RecordingDynamo(Dynamo):
    """Remembers every version a successful write stored, and every plain (unconditional)
    delete that succeeded, per event_id."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.written: dict[str, list[str]] = {}
        self.removed: set[str] = set()
        self._wlock = threading.Lock()

    def call(self, operation: str, **kwargs) -> dict:
        resp = super().call(operation, **kwargs)
        v = who = None
        if operation == "put_item" and "event_id" in kwargs["Item"]:
            v = kwargs["Item"].get("_rs_v", {}).get("S")
            who = kwargs["Item"]["event_id"]["S"]
        elif operation == "update_item":
            vals = kwargs.get("ExpressionAttributeValues", {})
            v = vals.get(":rs_nv", {}).get("S")
            who = next((x["S"] for x in vals.values() if x.get("S", "").startswith("e-")), None)
        elif operation == "delete_item" and "ConditionExpression" not in kwargs and "event_id" in kwargs["Key"]:
            with self._wlock:
                self.removed.add(kwargs["Key"]["event_id"]["S"])
        if v and who:
            with self._wlock:
                self.written.setdefault(who, []).append(v)
        return resp


@pytest.fixture
def dyn(dynalite_server):
    return RecordingDynamo(endpoint_url=dynalite_server.endpoint, region="us-east-1",
                           retry=RetryPolicy(max_attempts=6, base_seconds=0.01))


def ev(k: int, **extra) -> dict:
    return {"sensor_id": "s-1", "event_id": f"e-{k}", "ts": f"2024-10-27T15:{k:02d}:00Z", **extra}


def key(k: int) -> dict:
    return {f: v for f, v in ev(k).items()}


@pytest.mark.parametrize("phase", PHASES)
def test_threaded_read_your_writes(dyn, unique_name, phase):
    m = migration("sensor", table=unique_name)
    create_table(dyn, m)
    t = shim(m, dyn, phase)

    def worker(w: int) -> int:
        checks = 0
        for i in range(6):
            k = w * 10 + i
            t.put_item(Item=ev(k, val=f"{w}-{i}"))
            assert t.get_item(Key=key(k), ConsistentRead=True).get("Item") == ev(k, val=f"{w}-{i}")
            t.update_item(Key=key(k), UpdateExpression="ADD n :one", ExpressionAttributeValues={":one": 1})
            assert t.get_item(Key=key(k), ConsistentRead=True).get("Item")["n"] == Decimal(1)
            if i % 2:
                t.delete_item(Key=key(k))
                assert t.get_item(Key=key(k), ConsistentRead=True).get("Item") is None
            checks += 1
        return checks

    with ThreadPoolExecutor(4) as pool:
        assert sum(pool.map(worker, range(4))) == 24
    items = t.query(Key={"sensor_id": "s-1"}, ConsistentRead=True)["Items"]
    assert sorted(i["event_id"] for i in items) == sorted(f"e-{w * 10 + i}" for w in range(4) for i in (0, 2, 4))


@pytest.mark.parametrize("pair", [("dual_read", "cutover"), ("backfill", "cutover"), ("cutover", "cleanup"),
                                  ("dual_write", "dual_read")])
def test_adjacent_phases_write_the_same_keys(dyn, unique_name, pair):
    m = migration("sensor", table=unique_name)
    create_table(dyn, m)
    mapper = KeyMapper(m)
    a, b = shim(m, dyn, pair[0], writer_id="a"), shim(m, dyn, pair[1], writer_id="b")
    barrier = threading.Barrier(4)

    def writer(inst, name: str, seed: int) -> None:
        barrier.wait(timeout=10)
        for i in range(12):
            k = (i + seed) % 3
            op = (i * 7 + seed) % 4
            if op == 3:
                inst.delete_item(Key=key(k))
            elif op == 2:
                inst.update_item(Key=key(k), UpdateExpression="SET val = :v ADD n :one",
                                 ExpressionAttributeValues={":v": f"{name}{seed}-{i}", ":one": 1})
            else:
                inst.put_item(Item=ev(k, val=f"{name}{seed}-{i}"))

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(writer, inst, name, seed)
                   for inst, name in ((a, "a"), (b, "b")) for seed in (0, 1)]
        for f in futures:
            f.result(timeout=60)
    both_fenced = "cleanup" not in pair
    layouts = by_layout(mapper, scan(dyn, m.table))
    for k in range(3):
        ident = mapper.identity(mapper.logical_fields(ev(k)))
        old, new = layouts["old"].get(ident, []), layouts["new"].get(ident, [])
        assert len(old) <= 1 and len(new) <= 1
        if not new:
            # Only a cleanup shim's plain delete removes the new copy (fenced phases leave a
            # tombstone); it may be the key's last write when the other threads ran ahead.
            assert not both_fenced and f"e-{k}" in dyn.removed, (k, layouts)
            assert all(t.get_item(Key=key(k), ConsistentRead=True).get("Item") is None for t in (a, b))
            continue
        ra, rb = (t.get_item(Key=key(k), ConsistentRead=True).get("Item") for t in (a, b))
        assert ra == rb  # both instances read the same thing
        newest_written = max(dyn.written[f"e-{k}"])
        if both_fenced:
            # Both layouts hold the same item: the newest version any write stored for it.
            assert old[0]["_rs_v"]["S"] == new[0]["_rs_v"]["S"] == newest_written
            assert {x: v for x, v in old[0].items() if x not in ("PK", "_rs_new")} == {x: v for x, v in new[0].items() if x not in ("PK", "_rs_new")}
        else:
            # cleanup writes the new layout unfenced (DynamoDB's own last-writer-wins there).
            assert new[0]["_rs_v"]["S"] in dyn.written[f"e-{k}"]
