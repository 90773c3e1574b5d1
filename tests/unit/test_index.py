"""Sharded GSI partition keys: the ``[index.NAME]`` file format, IndexMapper and INDEX_ROUTING.

Pure tests with literals (reshard.core.migration, reshard.core.index).
"""

from __future__ import annotations

import itertools
import random

import pytest

from reshard.core import migration
from reshard.core.index import (INDEX_RETIRED, INDEX_ROUTING, IndexMapper, changes_index_writes,
                                index_routing, index_transition_refusal)
from reshard.core.layout import KeyMapper, hash_shard
from reshard.core.phases import ABORTABLE, ORDER, Action, Phase, target_of
from reshard.errors import MigrationFileError, UnmappableItem

INVOICES = """\
id = "invoices-gsi-4-to-16"
table = "InvoiceTransactions"

[keys]
partition = "PK"
sort = "SK"

[index.ByCountry]
partition = "gsi_shard"
sort = "tx_country"

[index.ByCountry.from]
partition = "{shard}"
shards = 4
shard_by = "random"

[index.ByCountry.to]
partition = "{shard}"
shards = 16
shard_by = ["PK"]
hash = "sha256"
"""

TABLE_LAYOUTS = """
[from]
partition = "{invoice}#{shard}"
shards = 2
shard_by = ["invoice"]

[to]
partition = "{invoice}#{shard}"
shards = 4
shard_by = ["invoice"]
"""


def edit(old: str, new: str, text: str = INVOICES) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def header(pk: str, country: str = "USA", shard: str | None = None, **extra) -> dict:
    item = {"PK": {"S": pk}, "SK": {"S": "root"}, "tx_country": {"S": country}}
    if shard is not None:
        item["gsi_shard"] = {"N": shard}
    item.update(extra)
    return item


# ----------------------------------------------------------------------------- the file

def test_index_only_file_parses_without_table_layouts():
    m = migration.parse(INVOICES)
    assert (m.source, m.target, m.changes_table) == (None, None, False)
    (ix,) = m.indexes
    assert (ix.name, ix.partition, ix.sort, ix.partition_type) == ("ByCountry", "gsi_shard", "tx_country", "N")
    assert ix.source.random and ix.source.shards == 4
    assert (ix.target.shard_by, ix.target.shards, ix.target.hash) == (("PK",), 16, "sha256")
    assert m.index("ByCountry") is ix and m.index("Other") is None


def test_table_and_index_file_keeps_both():
    m = migration.parse(edit("[keys]\npartition = \"PK\"\nsort = \"SK\"\n",
                             "[keys]\npartition = \"PK\"\nsort = \"SK\"\n" + TABLE_LAYOUTS)
                        .replace('shard_by = ["PK"]', 'shard_by = ["invoice"]'))
    assert m.changes_table and m.source.shards == 2 and m.target.shards == 4
    assert m.indexes[0].target.shard_by == ("invoice",)


def test_table_only_files_are_unchanged():
    m = migration.parse(TABLE_LAYOUTS.join(['id = "t-2-to-4"\ntable = "Tbl"\n[keys]\npartition = "PK"\n', ""]))
    assert m.changes_table and m.indexes == ()


def test_a_string_template_makes_a_string_attribute():
    m = migration.parse(INVOICES.replace('partition = "{shard}"', 'partition = "c#{shard}"'))
    assert m.indexes[0].partition_type == "S"


def test_key_mapper_refuses_an_index_only_file_in_one_line():
    with pytest.raises(MigrationFileError) as e:
        KeyMapper(migration.parse(INVOICES, "m.toml"))
    assert "\n" not in str(e.value)
    assert str(e.value) == ("m.toml: re-keying the table needs the table's [from]/[to] layouts; this file is "
                            "index-only (it rewrites GSI ByCountry in place)")


SORT = 'sort = "tx_country"\n'
MISTAKES = [
    ("changes-nothing", INVOICES.split("[index.ByCountry]")[0], None, "changes nothing"),
    ("from-without-to", INVOICES + '[from]\npartition = "{PK}#{shard}"\nshards = 2\nshard_by = ["x"]\n', "to",
     "[from] needs [to]"),
    ("index-attr-is-table-key", edit('partition = "gsi_shard"', 'partition = "PK"'), "index.ByCountry.partition",
     "key attribute of the table"),
    ("index-attr-reserved", edit('partition = "gsi_shard"', 'partition = "_rs_gsi"'), "index.ByCountry.partition",
     "reserved"),
    ("index-sort-is-partition", edit(SORT, 'sort = "gsi_shard"\n'), "index.ByCountry.sort", "must differ"),
    ("index-name-invalid", INVOICES.replace("ByCountry", '"B!"'), "index.B!", "not a valid DynamoDB index name"),
    ("index-missing-to", INVOICES.split("[index.ByCountry.to]")[0], "index.ByCountry.to", "missing"),
    ("index-layout-sort", edit("shards = 16\n", 'shards = 16\nsort = "{x}"\n'), "index.ByCountry.to.sort",
     "unknown key"),
    ("index-to-random", edit('shard_by = ["PK"]\nhash = "sha256"', 'shard_by = "random"'),
     "index.ByCountry.to.shard_by", "random"),
    ("index-from-equals-to", edit("shards = 4\nshard_by = \"random\"", 'shards = 16\nshard_by = ["PK"]\nhash = "sha256"'),
     "index.ByCountry.to", "identical"),
    ("index-no-shard", edit('[index.ByCountry.to]\npartition = "{shard}"', '[index.ByCountry.to]\npartition = "{PK}"'),
     "index.ByCountry.to.partition", "{shard}"),
    ("index-number-with-text", edit('[index.ByCountry.to]\npartition = "{shard}"',
                                    '[index.ByCountry.to]\npartition = "{tx_country}#{shard}"').replace(
        SORT, SORT + 'type = "N"\n'), "index.ByCountry.to.partition", "makes a string"),
    ("index-bad-type", edit(SORT, SORT + 'type = "B"\n'), "index.ByCountry.type", '"S" or "N"'),
    ("index-uses-its-own-attr", edit('shard_by = ["PK"]', 'shard_by = ["gsi_shard"]'), "index.ByCountry.to",
     "the attribute it rewrites"),
    ("index-shards-zero", edit("shards = 16", "shards = 0"), "index.ByCountry.to.shards", "from 1 to"),
    ("index-not-a-table", 'index = "ByCountry"\n' + INVOICES.split("[index.ByCountry]")[0], "index",
     "table of [index.NAME]"),
    ("combined-shards-by-table-key", edit("[index.ByCountry]", TABLE_LAYOUTS + "[index.ByCountry]"),
     "index.ByCountry.to", "whose value changes"),
]


@pytest.mark.parametrize("case,text,key,fragment", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_index_file_mistakes_name_the_key(case, text, key, fragment):
    with pytest.raises(MigrationFileError) as e:
        migration.parse(text, "m.toml")
    assert e.value.key == key, str(e.value)
    assert fragment in e.value.problem, str(e.value)
    assert "\n" not in str(e.value)


def test_two_indexes_cannot_share_an_attribute():
    second = INVOICES.split("[index.ByCountry]")[1].replace("tx_country", "region")
    with pytest.raises(MigrationFileError) as e:
        migration.parse(INVOICES + "[index.ByRegion]" + second.replace("[index.ByCountry.", "[index.ByRegion."))
    assert e.value.key == "index.ByRegion.partition" and "already the partition attribute" in e.value.problem


# ----------------------------------------------------------------------------- IndexMapper

@pytest.fixture
def mapper() -> IndexMapper:
    return IndexMapper(migration.parse(INVOICES).indexes[0])


def test_new_value_is_the_hash_of_shard_by(mapper):
    for i in range(50):
        pk = f"InvoiceNumber#{i}"
        want = hash_shard(pk, 16, "sha256")
        assert mapper.value(mapper.fields(header(pk), "new"), "new") == {"N": str(want)}


def test_random_old_value_stays_in_range(mapper):
    rng = random.Random(7)
    seen = {mapper.value({}, "old", rng)["N"] for _ in range(200)}
    assert seen == {"0", "1", "2", "3"}


def test_is_at(mapper):
    pk = "InvoiceNumber#121212"
    new = str(hash_shard(pk, 16, "sha256"))
    assert mapper.is_at(header(pk, shard="3"), "old")
    assert not mapper.is_at(header(pk, shard="7"), "old")  # outside 0..3
    assert mapper.is_at(header(pk, shard=new), "new")
    assert not mapper.is_at(header(pk, shard=str((int(new) + 1) % 16)), "new")
    assert not mapper.is_at(header(pk), "new")  # no value stored
    assert mapper.is_at(header(pk, shard="03"), "old")  # numbers compare by value
    # A stored string where the index attribute is a number is no shard of either layout.
    assert not mapper.is_at(header(pk, gsi_shard={"S": "3"}), "old")


def test_string_attribute_for_a_bare_shard_template():
    text = edit(SORT, SORT + 'type = "S"\n')
    m = IndexMapper(migration.parse(text).indexes[0])
    pk = "InvoiceNumber#1"
    new = m.value(m.fields(header(pk), "new"), "new")
    assert new == {"S": str(hash_shard(pk, 16, "sha256"))}
    assert m.is_at(header(pk, gsi_shard={"S": "2"}), "old")
    assert not m.is_at(header(pk, gsi_shard={"N": "2"}), "old")
    assert m.query_values("old", {}) == [{"S": str(i)} for i in range(4)]


def test_template_with_fields_and_derived_field():
    text = edit('[index.ByCountry.to]\npartition = "{shard}"\nshards = 16',
                '[index.ByCountry.to]\npartition = "{tx_country}#{day}#{shard:02d}"\nshards = 16\n'
                'fields = { day = { from = "created", format = "%Y-%m-%d" } }')
    m = IndexMapper(migration.parse(text.replace(SORT, SORT + 'type = "S"\n')).indexes[0])
    item = header("InvoiceNumber#9", created={"S": "2018-05-17T10:00:00Z"})
    shard = hash_shard("InvoiceNumber#9", 16, "sha256")
    assert m.value(m.fields(item, "new"), "new") == {"S": f"USA#2018-05-17#{shard:02d}"}
    assert m.shard_of({"S": f"USA#2018-05-17#{shard:02d}"}, "new") == shard
    values = m.query_values("new", {"tx_country": "USA", "created": "2018-05-17T23:00:00Z"})
    assert values == [{"S": f"USA#2018-05-17#{s:02d}"} for s in range(16)]
    with pytest.raises(UnmappableItem, match="equality on 'created'"):
        m.query_values("new", {"tx_country": "USA"})
    assert m.partition_fields() == {"tx_country", "created"}


def test_query_values(mapper):
    every_old = [{"N": str(i)} for i in range(4)]
    assert mapper.query_values("old", {"tx_country": "USA"}) == every_old
    assert mapper.query_values("new", {}) == [{"N": str(i)} for i in range(16)]
    # Every shard_by field fixed by an equality: one partition, the computed one.
    pk = "InvoiceNumber#5"
    assert mapper.query_values("new", {"PK": {"S": pk}}) == [{"N": str(hash_shard(pk, 16, "sha256"))}]
    assert mapper.query_values("old", {"PK": pk}) == every_old  # random: still every shard


def test_missing_field_and_sparse_index(mapper):
    with pytest.raises(UnmappableItem) as e:
        mapper.fields({"SK": {"S": "root"}}, "new")
    assert e.value.reason == "missing-field"
    line_item = {"PK": {"S": "InvoiceNumber#1"}, "SK": {"S": "line#1"}}
    assert not mapper.in_index(line_item)
    assert not mapper.in_index(header("InvoiceNumber#1"))  # no GSI value stored yet
    assert mapper.in_index(header("InvoiceNumber#1", shard="0"))


# ----------------------------------------------------------------------------- routing

def test_every_phase_has_an_index_routing():
    assert set(INDEX_ROUTING) == set(Phase)
    assert index_routing(Phase.ABORTED, retired=True) is INDEX_RETIRED
    assert index_routing(Phase.BACKFILL, retired=True) is INDEX_ROUTING[Phase.BACKFILL]


def _neighbours():
    """Every pair of phases that serve traffic together during a transition."""
    for action in Action:
        for phase in Phase:
            to, _ = target_of(action, phase)
            if to is not None:
                yield action, phase, to


def test_adjacent_phases_share_a_read_layout_and_read_what_the_other_writes():
    for action, a, b in _neighbours():
        ra, rb = INDEX_ROUTING[a], INDEX_ROUTING[b]
        if index_transition_refusal(action, a, b):
            continue
        assert set(ra.reads) & set(rb.reads), (a, b)
        # Each shim reads the value every shim of the other phase writes.
        assert rb.writes in ra.reads and ra.writes in rb.reads, (action, a, b)


def test_a_change_of_written_value_is_a_switch():
    changing = {(a, b) for _, a, b in _neighbours() if changes_index_writes(a, b)}
    assert changing == {(Phase.DUAL_WRITE, Phase.DUAL_READ), (Phase.DUAL_READ, Phase.DUAL_WRITE),
                        (Phase.DUAL_READ, Phase.ABORTED), (Phase.BACKFILL, Phase.ABORTED)}


def test_reads_end_with_the_written_layout():
    """Items move toward the written value, so the last pass reads it (module docstring, point 3)."""
    for phase, r in INDEX_ROUTING.items():
        assert r.reads[-1] == r.writes, phase


def test_readers_narrow_to_new_only_where_verify_proved_it():
    only_new = {p for p, r in INDEX_ROUTING.items() if r.reads == ("new",)}
    assert only_new == {Phase.CUTOVER, Phase.CLEANUP, Phase.COMPLETE}
    assert all(INDEX_ROUTING[p].reads != ("new",) for p in ABORTABLE)


def test_rollback_to_planned_is_refused():
    assert index_transition_refusal(Action.ROLLBACK, Phase.DUAL_WRITE, Phase.PLANNED)
    assert index_transition_refusal(Action.ABORT, Phase.DUAL_WRITE, Phase.ABORTED) is None
    assert index_transition_refusal(Action.ADVANCE, Phase.PLANNED, Phase.DUAL_WRITE) is None


def _fan_out(values: dict[str, str], reads: tuple[str, ...], moves, partitions) -> set[str]:
    """A query's passes over ``partitions[side]``; ``moves[(pass, partition)]`` happen just before
    that partition is read. Returns the items found."""
    found = set()
    for pass_no, side in enumerate(reads):
        for partition in partitions[side]:
            for item, value in moves.get((pass_no, partition), ()):
                values[item] = value
            found |= {item for item, v in values.items() if v == partition}
    return found


def _hidden(reads, source, dest, partitions):
    """Every (from, to, step) where one move of one item source -> dest hides it from the query."""
    steps = [(p, part) for p, side in enumerate(reads) for part in partitions[side]]
    return [(frm, to, at) for frm, to in itertools.product(partitions[source], partitions[dest])
            for at in range(len(steps) + 1)
            if "x" not in _fan_out({"x": frm}, reads, {steps[at]: [("x", to)]} if at < len(steps) else {},
                                   partitions)]


NESTED = {"old": [str(i) for i in range(4)], "new": [str(i) for i in range(16)]}  # "{shard}" both sides
DISJOINT = {"old": [f"a#{i}" for i in range(4)], "new": [f"b#{i}" for i in range(16)]}


@pytest.mark.parametrize("phase", [Phase.DUAL_READ, Phase.BACKFILL, Phase.ABORTED, Phase.DUAL_WRITE])
@pytest.mark.parametrize("partitions", [NESTED, DISJOINT], ids=["nested", "disjoint"])
def test_one_direction_moves_never_hide_an_item(phase, partitions):
    """Every interleaving of one item's move (toward the written layout) with a fan-out finds it.

    The move happens before any one partition read of the query, from any source value to any
    destination value; old and new values may overlap (0..3 inside 0..15) or not.
    """
    r = INDEX_ROUTING[phase]
    source = "new" if r.writes == "old" else "old"
    assert _hidden(r.reads, source, r.writes, partitions) == []
    # The pass order matters: reading the written layout first hides a moving item when the
    # layouts' values differ (with nested "{shard}" values, the wider pass happens to cover it).
    if partitions is DISJOINT:
        assert _hidden(tuple(reversed(r.reads)), source, r.writes, partitions)


# ----------------------------------------------------------------------------- plan / start checks

from reshard.core import capacity  # noqa: E402
from reshard.core.index_planning import IndexAnalysis, gsi_problems, index_entry_size, index_plan  # noqa: E402
from reshard.core.versions import VersionClock  # noqa: E402


def _desc(projection=None, gsi_type="N", schema=("gsi_shard", "tx_country"), name="ByCountry", status="ACTIVE"):
    keys = [{"AttributeName": schema[0], "KeyType": "HASH"}] + (
        [{"AttributeName": schema[1], "KeyType": "RANGE"}] if schema[1] else [])
    return {"AttributeDefinitions": [{"AttributeName": "PK", "AttributeType": "S"},
                                     {"AttributeName": "SK", "AttributeType": "S"},
                                     {"AttributeName": "gsi_shard", "AttributeType": gsi_type},
                                     {"AttributeName": "tx_country", "AttributeType": "S"}],
            "GlobalSecondaryIndexes": [{"IndexName": name, "KeySchema": keys, "IndexStatus": status,
                                        "Projection": projection or {"ProjectionType": "ALL"}}]}


@pytest.mark.parametrize("desc,fragment", [
    (_desc(name="Other"), "has no global secondary index 'ByCountry' (its GSIs: Other)"),
    (_desc(status="CREATING"), "is CREATING; wait until it is ACTIVE"),
    (_desc(schema=("gsi_shard", None)), "has partition 'gsi_shard', sort None but the file says"),
    (_desc(gsi_type="S"), 'has type S but the layouts write N (set type = "S"'),
    (_desc({"ProjectionType": "KEYS_ONLY"}), "projects KEYS_ONLY"),
    (_desc({"ProjectionType": "INCLUDE", "NonKeyAttributes": ["amount"]}), "projects INCLUDE without '_rs_v'"),
])
def test_gsi_problems_one_line_each(desc, fragment):
    (problem,) = gsi_problems(desc, migration.parse(INVOICES))
    assert fragment in problem and "\n" not in problem and problem.startswith("[index.ByCountry]: ")


def test_gsi_problems_accept_all_and_include_with_version():
    m = migration.parse(INVOICES)
    assert gsi_problems(_desc(), m) == []
    assert gsi_problems(_desc({"ProjectionType": "INCLUDE", "NonKeyAttributes": ["_rs_v", "amount"]}), m) == []


def test_index_analysis_counts_skew_and_rewrite_cost():
    """Per moved item: the table write plus a GSI delete and a GSI put (each of the index entry)."""
    m = migration.parse(INVOICES)
    plan = index_plan(m, _desc({"ProjectionType": "INCLUDE", "NonKeyAttributes": ["_rs_v"]}))
    a = plan.analyses["ByCountry"]
    big = "x" * 3000  # a 3 KB attribute: 3 WCU for the table write, not projected into the index
    new = {}
    for i in range(40):
        pk = f"InvoiceNumber#{i}"
        new[i] = hash_shard(pk, 16, "sha256")
        shard = str(new[i]) if i < 4 and new[i] < 4 else str(next(s for s in range(4) if s != new[i]))
        plan.observe(header(pk, shard=shard, blob={"S": big}))
    plan.observe({"PK": {"S": "InvoiceNumber#1"}, "SK": {"S": "line#1"}})  # not in the index
    plan.observe(header("InvoiceNumber#99", shard="12"))  # 12 is no old value and not its new one
    assert plan.scanned == 42 and a.not_indexed == 1 and a.indexed == 41
    already = sum(1 for i in range(4) if new[i] < 4)
    assert (a.at_new, a.moves) == (already, 40 - already)
    assert hash_shard("InvoiceNumber#99", 16, "sha256") != 12 and a.unmappable == {"off-layout": 1}
    assert a.table_wcu == 3 * a.moves  # ceil(3 KB item / 1 KB)
    assert a.index_wcu == 2 * a.moves  # a small entry (keys + _rs_v + 100 bytes): 1 WCU each for delete and put
    assert a.new_distribution().total == 40 and a.old_distribution().total == 40  # already-new values are old too
    cap = plan.capacity(84, max_wcu=10, write_price=1.0, read_price=1.0)
    assert cap["scale"] == 2.0 and cap["backfill"]["wcu"] == 2 * 5 * a.moves
    assert "nothing to expire" in cap["cleanup"]
    # verify: the scan again, and every (small: keys + _rs_v) index entry once, whatever it moves.
    assert 41 * 100 < a.entry_bytes < 41 * 200  # 41 indexed items: keys + _rs_v + 100 bytes each, no blob
    assert cap["verify"] == {"scan_rcu": cap["backfill"]["scan_rcu"], "index_rcu": capacity.scan_units(2 * a.entry_bytes),
                             "rcu": cap["backfill"]["scan_rcu"] + capacity.scan_units(2 * a.entry_bytes)}
    assert cap["verify"]["index_rcu"] < cap["verify"]["scan_rcu"]  # the 3 KB blob is not projected
    assert plan.blockers(0) and not plan.blockers(1)


def test_index_entry_size_by_projection():
    m = migration.parse(INVOICES)
    spec = m.indexes[0]
    item = header("InvoiceNumber#1", shard="1", blob={"S": "y" * 500}, _rs_v={"S": VersionClock("w").next()})
    full = index_entry_size(item, m.keys, spec, {"ProjectionType": "ALL"})
    keys_only = index_entry_size(item, m.keys, spec, {"ProjectionType": "KEYS_ONLY"})
    assert full > 600 and keys_only < 200 and keys_only >= 100


def test_iam_grants_query_on_the_index_arn():
    """A Query with IndexName is authorized on table/T/index/NAME: the app's and the worker's Query."""
    from reshard.core.iam import policy
    for role in ("app", "worker"):
        doc = policy(role, "InvoiceTransactions", "ctl", indexes=("ByCountry",))
        (st,) = [s for s in doc["Statement"] if "dynamodb:Query" in s["Action"] and "InvoiceTransactions" in
                 s["Resource"][0]]
        assert st["Resource"][-1] == "arn:aws:dynamodb:*:*:table/InvoiceTransactions/index/ByCountry"
        # The rewrite's UpdateItem (worker) and the shim's writes (app) on the data table.
        assert any("dynamodb:UpdateItem" in s["Action"] and s["Resource"][0].endswith("table/InvoiceTransactions")
                   for s in doc["Statement"])
    assert all("/index/" not in r for s in policy("app", "T", "ctl")["Statement"] for r in s["Resource"])


def test_one_conditioned_update_rewrites_every_index_of_an_item():
    """Two [index.NAME] tables: one UpdateItem sets both attributes, conditioned on the version
    and on each value scanned (never a blind write)."""
    import contextlib

    from reshard.core.index import mappers
    from reshard.jobs.index_jobs import IndexRewrite

    second = INVOICES.split("[index.ByCountry]")[1].replace("[index.ByCountry.", "[index.ByRegion.")
    second = second.replace('partition = "gsi_shard"', 'partition = "gsi_region"').replace("tx_country", "region")
    m = migration.parse(INVOICES + "[index.ByRegion]" + second)
    calls = []

    class Dynamo:
        def call(self, op, guard=None, **kw):
            calls.append((op, kw))
            return {}

    class Budget:
        def spend(self, kind, units):
            return contextlib.nullcontext()

    rw = IndexRewrite(Dynamo(), None, m.id, "backfill", mappers(m.indexes), m.keys, "T", Budget(), "new", {})
    version = VersionClock("w").next()
    pk = "InvoiceNumber#7"
    item = header(pk, shard="1", gsi_region={"N": "2"}, region={"S": "EU"}, _rs_v={"S": version})
    want = str(hash_shard(pk, 16, "sha256"))
    assert want not in ("1", "2")
    outcome, changes = rw.plan(item)
    assert outcome == "moved" and [c[0].name for c in changes] == ["ByCountry", "ByRegion"]
    assert rw._update(lambda: None, (item, changes)) == "moved"
    (op, kw), = calls
    assert op == "update_item" and kw["UpdateExpression"] == "SET #g0 = :g0, #g1 = :g1"
    assert kw["ConditionExpression"] == "(#rs_v = :rs_v) AND #g0 = :seen0 AND #g1 = :seen1"
    assert kw["ExpressionAttributeValues"][":rs_v"] == {"S": version}
    assert (kw["ExpressionAttributeValues"][":g0"], kw["ExpressionAttributeValues"][":g1"]) == ({"N": want},) * 2
    assert (kw["ExpressionAttributeValues"][":seen0"], kw["ExpressionAttributeValues"][":seen1"]) == (
        {"N": "1"}, {"N": "2"})


def test_plan_warns_when_the_templates_need_different_query_fields():
    """{shard} -> {region}#{shard}: an app query without region is answered in planned and
    refused from dual_write on (it cannot form the new values): plan says so beforehand."""
    from reshard.operations import index_warnings
    same = index_plan(migration.parse(INVOICES), _desc())
    assert not [w for w in index_warnings(same) if "query fields" in w]
    text = INVOICES.replace('[index.ByCountry.to]\npartition = "{shard}"', '[index.ByCountry.to]\npartition = "{region}#{shard}"')
    assert text != INVOICES
    warned = [w for w in index_warnings(index_plan(migration.parse(text), _desc(gsi_type="S")))
              if "query fields" in w]
    assert len(warned) == 1 and "none / region" in warned[0] and "equality on each of region" in warned[0]
