"""Every key shape the layouts allow, S, N and B (issue 13), on moto: fast functional checks.

For each shape: `start` accepts it (its checks pass on real pre-migration items), the
backfill's remap and the shim agree, and the application reads back exactly the attribute
names and types it wrote, in the old layout, in backfill (both layouts) and after cutover.
The shapes a layout cannot hold are refused by `plan` and `start` with one line. The
whole migration with shim traffic on dynalite is tests/integration/test_key_shapes_lifecycle.py.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from reshard import errors, operations
from reshard.aws.dynamo import to_wire
from reshard.aws.local import create_table
from reshard.control.store import ControlStore
from reshard.core.layout import KeyMapper
from reshard.core.migration import parse
from reshard.core.phases import Phase

from tests.shim_helpers import read_item, shim

SHAPES = {
    # name: ([keys] and layouts, key attribute types, logical key of item i)
    "partition-only-S": ('partition = "pk"',
                         'partition = "{device_id}#{shard}"\nshards = 3\nshard_by = ["device_id"]',
                         'partition = "{device_id}#{shard}"\nshards = 6\nshard_by = ["device_id"]',
                         {"pk": "S"}, lambda i: {"device_id": f"d{i}"}),
    "partition-and-sort-S": ('partition = "PK"\nsort = "SK"',
                             'partition = "{sensor_id}#{shard}"\nsort = "{ts}"\nshards = 3\nshard_by = ["ts"]',
                             'partition = "{sensor_id}#{shard}"\nsort = "{ts}"\nshards = 6\nshard_by = ["ts"]',
                             {"PK": "S", "SK": "S"}, lambda i: {"sensor_id": f"s{i % 2}", "ts": f"t{i:03d}"}),
    "sort-N-kept": ('partition = "PK"\nsort = "SK"',
                    'partition = "{sensor_id}#{shard}"\nshards = 3\nshard_by = ["SK"]',
                    'partition = "{sensor_id}#{shard}"\nshards = 6\nshard_by = ["SK"]',
                    {"PK": "S", "SK": "N"}, lambda i: {"sensor_id": f"s{i % 2}", "SK": Decimal(1000 + i)}),
    "sort-B-kept": ('partition = "PK"\nsort = "SK"',
                    'partition = "{sensor_id}#{shard}"\nshards = 3\nshard_by = ["sensor_id", "n"]',
                    'partition = "{sensor_id}#{shard}"\nshards = 6\nshard_by = ["sensor_id", "n"]',
                    {"PK": "S", "SK": "B"}, lambda i: {"sensor_id": f"s{i % 2}", "n": f"{i}",
                                                       "SK": bytes([i, 255 - i])}),
    # A number partition key kept as is: the shard goes into the (string) sort key.
    "partition-N-kept": ('partition = "PK"\nsort = "SK"',
                         'partition = "{PK}"\nsort = "{shard}#{ts}"\nshards = 3\nshard_by = ["ts"]',
                         'partition = "{PK}"\nsort = "{shard}#{ts}"\nshards = 6\nshard_by = ["ts"]',
                         {"PK": "N", "SK": "S"}, lambda i: {"PK": Decimal(i % 2), "ts": f"t{i:03d}"}),
}


def migration_of(shape: str, table: str):
    keys, frm, to, types, key_of = SHAPES[shape]
    m = parse(f'id = "{shape}"\ntable = "{table}"\n[keys]\n{keys}\n[from]\n{frm}\n[to]\n{to}\n', f"<{shape}>")
    return m, types, key_of


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_key_shape_starts_copies_and_reads_back(shape, moto_dynamo):
    m, types, key_of = migration_of(shape, "Shapes")
    mapper = KeyMapper(m)
    create_table(moto_dynamo, m.table, m.keys, types=types)
    items = [dict(key_of(i), temp=Decimal(i), raw=b"\x00\x01") for i in range(12)]
    moto_dynamo.batch_write(m.table, [{"PutRequest": {"Item": mapper.to_physical(to_wire(x), mapper.old)}}
                                      for x in items])

    store = ControlStore(moto_dynamo, "ctl")
    started = operations.start(moto_dynamo, store, m, server_deadline=False)
    assert started.created and started.checked.mappable == 12 and started.checked.unmappable_count == 0

    moved, copies = 0, []
    for x in items:
        phys = mapper.to_physical(to_wire(x), mapper.old)
        new, moves = mapper.remap(phys)
        moved += moves
        copies += [new] if moves else []
        # The key kept as is keeps its type; the logical item is what the application wrote.
        for a in m.keys.partition, m.keys.sort:
            if a and types[a] != "S":
                assert set(new[a]) == {types[a]}
        assert mapper.to_logical(new, mapper.new) == to_wire(x)
    assert moved  # the migration moves something in every shape

    for n, phase in enumerate((Phase.PLANNED, Phase.BACKFILL, Phase.CUTOVER)):
        if phase is Phase.CUTOVER:  # what the backfill would have copied
            moto_dynamo.batch_write(m.table, [{"PutRequest": {"Item": c}} for c in copies])
        t = shim(m, moto_dynamo, phase=phase)
        k = key_of(100 + n)
        t.put_item(Item=dict(k, v=Decimal(1)))
        t.update_item(Key=k, UpdateExpression="SET w = :w", ExpressionAttributeValues={":w": "x"})
        assert read_item(t, Key=k, ConsistentRead=True) == dict(k, v=Decimal(1), w="x")
        for x in items:
            assert read_item(t, Key={a: x[a] for a in key_of(0)}, ConsistentRead=True) == x, (phase, x)
        if "{shard}" in m.target.partition_text:  # a query fans out over the partition's shards
            pf = next(p.field for p in m.target.partition if p.field and p.field != "shard")
            got = t.query(Key={pf: items[0][pf]}, ConsistentRead=True)["Items"]
            want = [x for x in (*items, dict(k, v=Decimal(1), w="x")) if x[pf] == items[0][pf]]
            assert len(got) == len(want) and all(w in got for w in want), (phase, got)  # boto3's Binary == bytes
        t.delete_item(Key=k)
        assert read_item(t, Key=k, ConsistentRead=True) is None


@pytest.mark.parametrize("types,problem", [
    ({"PK": "N", "SK": "S"}, "key attribute 'PK' has type N"),
    ({"PK": "B", "SK": "S"}, "key attribute 'PK' has type B"),
    ({"PK": "S", "SK": "N"}, "key attribute 'SK' has type N"),
])
def test_a_key_type_that_cannot_hold_a_template_is_refused_by_plan_and_start(types, problem, moto_dynamo):
    """A number or binary key attribute cannot carry "#shard" (or any template text)."""
    m = parse('id = "bad-types"\ntable = "Types"\n[keys]\npartition = "PK"\nsort = "SK"\n'
              '[from]\npartition = "{sensor_id}#{shard}"\nsort = "t#{ts}"\nshards = 2\nshard_by = ["ts"]\n'
              '[to]\npartition = "{sensor_id}#{shard}"\nsort = "t#{ts}"\nshards = 4\nshard_by = ["ts"]\n', "<m>")
    create_table(moto_dynamo, m.table, m.keys, types=types)
    with pytest.raises(errors.TableProblem, match=problem):
        operations.plan(moto_dynamo, m)
    with pytest.raises(errors.BadInput, match=problem) as e:
        operations.start(moto_dynamo, ControlStore(moto_dynamo, "ctl"), m, server_deadline=False)
    assert len(str(e.value).splitlines()) == 2  # the headline and one line for the one problem
