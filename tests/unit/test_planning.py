"""Planning math with literals: unit rules, distributions, histogram, estimates, recommendation."""

from __future__ import annotations

import hashlib

import pytest

from reshard.core import migration

from reshard.core import capacity, planning
from reshard.core.layout import KeyMapper

SENSOR = """\
id = "s"
table = "SensorEvents"
[keys]
partition = "PK"
sort = "SK"
[from]
partition = "{sensor_id}#{shard}"
sort = "{ts}"
shards = 2
shard_by = ["event_id"]
[to]
partition = "{sensor_id}#{shard}"
sort = "{ts}"
shards = 4
shard_by = ["event_id"]
"""


def h(s: str) -> int:
    return int(hashlib.sha256(s.encode()).hexdigest(), 16)


def test_unit_rules():
    assert capacity.write_units(1) == 1
    assert capacity.write_units(1024) == 1
    assert capacity.write_units(1025) == 2
    assert capacity.write_units(0) == 1
    assert capacity.read_units(4096) == 1
    assert capacity.read_units(4097) == 2
    assert capacity.read_units(4097, consistent=False) == 1.0
    assert capacity.read_units(100, consistent=False) == 0.5
    assert capacity.scan_units(0) == 0
    assert capacity.scan_units(4096) == 0.5
    assert capacity.scan_units(4096 * 10 + 1) == 5.5


def test_distribution_skew_and_hottest():
    d = planning.distribution([0, 0, 0, 1, 2, 2], 4)
    assert d.counts == (3, 1, 2, 0)
    assert d.total == 6 and d.mean == 1.5 and d.max == 3
    assert d.skew == 2.0
    assert d.hottest_shard == 0
    assert d.hottest_pct == 50.0
    assert d.empty_shards == 1
    assert d.as_dict()["counts"] == [3, 1, 2, 0]


def test_distribution_even_and_empty():
    assert planning.distribution([0, 1, 2, 3], 4).skew == 1.0
    empty = planning.distribution([], 3)
    assert (empty.skew, empty.hottest_shard, empty.hottest_pct) == (0.0, None, 0.0)
    with pytest.raises(ValueError):
        planning.distribution([4], 4)


def test_histogram_lines():
    d = planning.distribution([0] * 10 + [1] * 5 + [3], 4)
    text = planning.histogram(d, width=10)
    assert text.splitlines() == [
        "  shard 0 | ########## 10  (62.5%)",
        "  shard 1 | #####       5  (31.2%)",
        "  shard 2 |             0  ( 0.0%)",
        "  shard 3 | #           1  ( 6.2%)",
    ]


def test_recommendation_formula_and_warning():
    # The AWS blog's example: 5000 writes/s of 1 KB items need 5 partitions.
    r = planning.recommend(5000, 1, target_shards=8, headroom=1.5)
    assert (r.base, r.shards) == (5, 8)
    assert r.warning is None
    # 2.2 KB rounds up to 3 WCU per write: ceil(1500 * 3 / 1000) = 5, x2 = 10.
    r = planning.recommend(1500, 2.2, target_shards=8, headroom=2)
    assert (r.base, r.shards) == (5, 10)
    assert "below the recommended 10" in r.warning
    # Exactly at the limit: no headroom rounding surprises.
    assert planning.recommend(1000, 1, 1, headroom=1).shards == 1
    assert planning.recommend(1, 0.1, 1).shards == 2  # base 1, x1.5 -> 2
    with pytest.raises(ValueError):
        planning.recommend(100, 1, 4, headroom=0.5)


def test_sample_quota_spreads_the_sample():
    assert list(planning.sample_quota(10, 4)) == [3, 3, 2, 2]
    assert list(planning.sample_quota(2, 4)) == [1, 1, 0, 0]
    assert sum(planning.sample_quota(2000, 7)) == 2000


def test_human_seconds():
    assert planning.human_seconds(None) == "-"
    assert planning.human_seconds(0.2) == "1s"
    assert planning.human_seconds(3725) == "1h 2m 5s"
    assert planning.human_seconds(86400 + 60) == "1d 1m"


def sensor_item(event_id: str, shards: int = 2, pad: int = 0) -> dict:
    return {"PK": {"S": f"s1#{h(event_id) % shards}"}, "SK": {"S": f"t-{event_id}"},
            "sensor_id": {"S": "s1"}, "event_id": {"S": event_id}, "blob": {"S": "x" * pad}}


def test_sample_analysis_counts_and_units():
    mapper = KeyMapper(migration.parse(SENSOR))
    ids = [f"e{i}" for i in range(40)]
    a = planning.SampleAnalysis(mapper, examples_limit=1)
    for e in ids:
        a.observe(sensor_item(e, pad=2000))  # ~2 KB items: 2 WCU per write, 1 RCU per read
    a.observe({"PK": {"S": "nohash"}, "SK": {"S": "x"}})
    a.observe({"PK": {"S": "nohash2"}, "SK": {"S": "x"}})
    moved = [e for e in ids if h(e) % 4 != h(e) % 2]
    assert 0 < len(moved) < len(ids)
    assert (a.scanned, a.mappable, a.moves) == (42, 40, len(moved))
    assert a.unmappable == {"unparseable-key": 2}
    assert len(a.examples) == 1 and a.examples[0]["key"] == {"PK": "nohash", "SK": "x"}
    assert a.old_distribution().counts == tuple(sum(1 for e in ids if h(e) % 2 == s) for s in range(2))
    assert a.new_distribution().counts == tuple(sum(1 for e in ids if h(e) % 4 == s) for s in range(4))
    assert a.write_wcu == 2 * len(moved)
    assert a.retire_wcu == 2 * len(moved)
    assert a.fence_read_rcu == 0  # no read-back; no two old items share a new key here

    est = planning.estimate(a, table_items=420, max_wcu=10, write_price=1.0, read_price=0.5)
    assert est.scale == 10
    assert est.backfill.wcu == 20 * len(moved)
    assert est.backfill.fence_read_rcu == 0 and est.backfill.rcu == est.backfill.scan_rcu
    assert est.backfill.scan_rcu == capacity.scan_units(a.bytes_all * 10)
    assert est.cleanup.wcu == 20 * len(moved)
    assert est.cleanup.scan_rcu == capacity.scan_units((a.bytes_all + a.bytes_moved_new) * 10)
    assert est.backfill_seconds == 2 * len(moved)
    assert est.cost(est.backfill) == pytest.approx(est.backfill.rcu / 1e6 * 0.5 + est.backfill.wcu / 1e6)


def test_estimate_literals():
    """A hand-made sample: 1000 items of 3 KB, 100 of which move, scaled to 1,000,000 items."""
    a = planning.SampleAnalysis(mapper=None)
    a.scanned, a.bytes_all = 1000, 1000 * 3 * 1024
    a.bytes_moved_new, a.fence_read_rcu, a.write_wcu, a.retire_wcu = 100 * 3 * 1024, 100.0, 300, 300
    est = planning.estimate(a, 1_000_000, max_wcu=1000)
    assert est.scale == 1000
    assert est.backfill.scan_rcu == 375_000  # 3 GB / 4 KB / 2
    assert est.backfill.fence_read_rcu == 100_000
    assert est.backfill.wcu == 300_000
    assert est.cleanup.scan_rcu == 412_500  # 3.3 GB scanned
    assert est.cleanup.wcu == 300_000
    assert est.backfill_seconds == 300
    # Default prices: $0.625 per million WRU, $0.125 per million RRU.
    assert est.cost(est.backfill) == pytest.approx(0.475 * 0.125 + 0.3 * 0.625)
    d = est.as_dict()
    assert d["on_demand"]["total_usd"] == round(est.cost(est.backfill) + est.cost(est.cleanup), 4)


def test_estimate_empty_table_and_lagging_item_count():
    a = planning.SampleAnalysis(mapper=None)
    assert planning.estimate(a, 0).backfill.wcu == 0
    a.scanned, a.write_wcu = 10, 5
    # DescribeTable's ItemCount lags: never scale below what was seen.
    assert planning.estimate(a, 3).scale == 1


def test_new_layout_copies_and_tombstones_are_not_unmappable():
    mapper = KeyMapper(migration.parse(SENSOR))
    e = next(f"e{i}" for i in range(100) if h(f"e{i}") % 4 >= 2)  # lives in new shard 2 or 3
    copy = {"PK": {"S": f"s1#{h(e) % 4}"}, "SK": {"S": "t"}, "sensor_id": {"S": "s1"}, "event_id": {"S": e},
            "_rs_new": {"S": mapper.migration.id}}
    tomb = {**sensor_item("e1"), "_rs_v": {"S": "1"}, "_rs_del": {"BOOL": True}}
    a = planning.SampleAnalysis(mapper)
    for item in (copy, tomb, sensor_item("e2")):
        a.observe(item)
    assert (a.scanned, a.in_new_layout, a.tombstones, a.mappable, a.unmappable_count) == (3, 1, 1, 1, 0)
    # Without this migration's marker the same key is an old item the [from] layout cannot map.
    b = planning.SampleAnalysis(mapper)
    b.observe({k: v for k, v in copy.items() if k != "_rs_new"})
    assert (b.in_new_layout, b.unmappable_count) == (0, 1)


def test_fence_reads_are_estimated_only_where_two_old_items_meet_at_one_new_key():
    """The copy has no read-back: it reads a new key only when an unversioned item's fence fails
    because another old item got there first (a duplicate or a collision)."""
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    mapper = KeyMapper(migration.parse((root / "migrations" / "0002_invoices.toml").read_text()))
    a = planning.SampleAnalysis(mapper=mapper)

    def old(n: int, line: str, shard: int, **extra) -> dict:
        fields = {"invoice_number": {"S": str(n)}, "line": {"S": line}, "amount": {"N": "1"}, **extra}
        return mapper.to_physical(fields, mapper.old, shard)

    def new_shard(n: int, line: str) -> int:
        return mapper.new.shard_for({"invoice_number": str(n), "line": line})

    n = next(n for n in range(100, 500) if new_shard(n, "0") >= 10)  # every old copy moves
    m = next(m for m in range(n + 1, 900) if new_shard(m, "0") >= 10)
    a.observe(old(n, "0", 1))
    a.observe(old(n, "0", 2))                                        # a duplicate: 1 read
    a.observe(old(m, "0", 3, amount={"N": "1"}))
    a.observe(old(m, "0", 4, amount={"N": "2"}))                     # a collision: 1 read
    a.observe(old(m, "0", 5, _rs_v={"S": "1700000000000.000000.w"}))  # versioned: fenced, no read
    assert a.moves == 5 and a.collisions == 1
    assert a.fence_read_rcu == 2 * capacity.read_units(200, consistent=True)
    est = planning.estimate(a, table_items=5)
    assert est.backfill.rcu == est.backfill.scan_rcu + a.fence_read_rcu
