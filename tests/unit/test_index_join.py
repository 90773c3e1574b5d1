"""Index verify's join (core/index_join.py, jobs/index_jobs.IndexJoin): which (index, table key)
pairs the records clear, which are re-checked, how a re-check judges, and that the join
streams through SQLite files (memory does not grow with the items)."""

from __future__ import annotations

import tracemalloc

from reshard.core.index import IndexMapper
from reshard.core.index_join import (ENTRY, GSI_DIFFERS, GSI_EXTRA, GSI_MISSING, SCAN, agrees, entry_record, judge,
                                     scan_record, targets, verdict)
from reshard.core.migration import parse
from reshard.core.layout import hash_shard
from reshard.jobs.index_jobs import IndexJoin
from reshard.jobs.records import END, SegmentFiles

from tests.index_support import gsi_migration, header

KEYS = ["PK", "SK"]
M = IndexMapper(parse(gsi_migration(), "<gsi>").indexes[0])
V1, V2 = "1700000000000.000000.a", "1700000000001.000000.b"


def at_new(i: int, **extra) -> dict:
    """Header ``i`` at its [to] value (hash(customer) % 16)."""
    return dict(header(i, hash_shard(f"c-{i}", 16, "sha256")), **extra)


def entry(item: dict, **changes) -> dict:
    """The index entry of ``item`` as a fan-out query returns it (keys, GSI keys, _rs_v)."""
    e = {k: item[k] for k in ("PK", "SK", "gsi_shard", "tx_country", "_rs_v") if k in item}
    return dict(e, **changes)


def cases() -> dict[str, tuple[list, bool, str | None]]:
    """Per table key: its records, whether they agree, and the join's verdict otherwise."""
    ok = at_new(0, _rs_v={"S": V1})
    def off(i: int) -> dict:  # at an old value: the scan reports gsi_value
        return header(i, 3 if hash_shard(f"c-{i}", 16, "sha256") != 3 else 2)
    return {
        "agree": ([scan_record(M, ok, KEYS), entry_record(M, entry(ok), KEYS)], True, None),
        "missing": ([scan_record(M, at_new(2), KEYS)], False, GSI_MISSING),
        # Off its [to] value: the fan-out need not return it, but what it returns must match.
        "off-absent": ([scan_record(M, off(1), KEYS)], True, None),
        "off-present": ([scan_record(M, off(9), KEYS), entry_record(M, entry(off(9)), KEYS)], True, None),
        "extra": ([entry_record(M, entry(at_new(3)), KEYS)], False, GSI_EXTRA),
        "twice": ([scan_record(M, at_new(4), KEYS), entry_record(M, entry(at_new(4)), KEYS),
                   entry_record(M, entry(at_new(4), gsi_shard={"N": "99"}), KEYS)], False, GSI_EXTRA),
        "sort": ([scan_record(M, at_new(5), KEYS),
                  entry_record(M, entry(at_new(5), tx_country={"S": "FRA"}), KEYS)], False, GSI_DIFFERS),
        "partition": ([scan_record(M, at_new(6), KEYS),
                       entry_record(M, entry(at_new(6), gsi_shard={"N": "99"}), KEYS)], False, GSI_DIFFERS),
        "version": ([scan_record(M, at_new(7, _rs_v={"S": V2}), KEYS),
                     entry_record(M, entry(at_new(7, _rs_v={"S": V1})), KEYS)], False, GSI_DIFFERS),
        # A tombstone that carries the GSI attributes: not required in the fan-out.
        "tombstone": ([scan_record(M, at_new(8, _rs_del={"BOOL": True}, _rs_v={"S": V2}), KEYS)], True, None),
    }


def build(directory, scan: list, entries: list, segments: int = 2) -> dict[bytes, str]:
    """The scan records as ``segments`` segment files, the entries as the index side's; join."""
    files = SegmentFiles(directory)
    for s in range(segments):
        files.write_page(s, END, END, scan[s::segments])
    files.close()
    index_dir = directory / "index"
    files = SegmentFiles(index_dir)
    files.write_page(0, END, "q1", entries[: len(entries) // 2])
    files.write_page(0, "q1", END, entries[len(entries) // 2:])
    files.close()
    join = IndexJoin(directory)
    join.index_dir = index_dir
    try:
        counts = join.build(segments, None)
        found = {i: why for i, _f, why in join.suspects(b"", 1_000_000)}
        assert counts["suspects"] == len(found)
        return found
    finally:
        join.close()


def test_the_sql_join_and_the_rule_agree_on_every_case(tmp_path):
    scan, entries, want = [], [], {}
    for name, (records, ok, kind) in cases().items():
        assert agrees(records) is ok, name
        if not ok:
            assert verdict(records) == kind, name
            want[records[0].ident] = kind
        scan += [r for r in records if r.side == SCAN]
        entries += [r for r in records if r.side == ENTRY]
    assert build(tmp_path, scan, entries) == want


def test_a_re_check_judges_the_item_and_its_entries_as_they_are_now():
    item = at_new(0, _rs_v={"S": V1})
    assert judge(M, item, [entry(item)]) == (None, "")
    assert judge(M, None, []) == (None, "")
    assert judge(M, item, [])[0] == GSI_MISSING
    assert judge(M, item, [entry(item), entry(item, gsi_shard={"N": "99"})])[0] == GSI_EXTRA
    kind, detail = judge(M, item, [entry(item, tx_country={"S": "FRA"})])
    assert kind == GSI_DIFFERS and "tx_country 'FRA'" in detail
    kind, detail = judge(M, dict(item, _rs_v={"S": V2}), [entry(item)])
    assert kind == GSI_DIFFERS and f"version {V1} (the item's {V2})" in detail
    kind, detail = judge(M, None, [entry(item)])
    assert kind == GSI_EXTRA and "absent" in detail
    # A tombstone carrying the GSI attributes: the fan-out need not return it; an entry must mirror it.
    tomb = dict(item, _rs_del={"BOOL": True}, _rs_v={"S": V2})
    assert judge(M, tomb, [])[0] is None and judge(M, tomb, [entry(tomb)])[0] is None
    assert judge(M, tomb, [entry(item)])[0] == GSI_DIFFERS
    # What a re-check queries comes back from the join's rows with its types (binary too).
    binary = at_new(1, tx_country={"B": b"\x00\xff"})
    rows = [scan_record(M, binary, KEYS).fields, entry_record(M, entry(binary, gsi_shard={"N": "99"}), KEYS).fields]
    assert targets(rows) == ("ByCountry", {"PK": binary["PK"], "SK": binary["SK"]},
                             [(binary["gsi_shard"], {"B": b"\x00\xff"}), ({"N": "99"}, {"B": b"\x00\xff"})])


def test_the_join_streams_records_through_files_not_memory(tmp_path):
    """8,000 records (4,000 items on each side, one entry dropped, one added): Python's
    peak allocation while joining stays far below what holding the records would take
    (a Record is ~ 1 KB of Python objects); SQLite's own page cache is bounded by
    ``records.CACHE_KIB``. The two planted differences are the only suspects."""
    n = 4_000
    items = [at_new(i, _rs_v={"S": V1}) for i in range(n)]
    scan = [scan_record(M, it, KEYS) for it in items]
    entries = [entry_record(M, entry(it), KEYS) for it in items[1:]]  # header(0)'s entry dropped
    ghost = at_new(n + 1)
    entries.append(entry_record(M, entry(ghost), KEYS))
    want = {scan[0].ident: GSI_MISSING, entries[-1].ident: GSI_EXTRA}
    files = SegmentFiles(tmp_path)
    for s in range(4):
        for p in range(0, n // 4, 500):
            part = scan[s::4][p:p + 500]
            files.write_page(s, f"p{p}" if p else END, f"p{p + 500}" if p + 500 < n // 4 else END, part)
    files.close()
    index_dir = tmp_path / "index"
    files = SegmentFiles(index_dir)
    for p in range(0, len(entries), 500):
        files.write_page(0, f"q{p}" if p else END, f"q{p + 500}" if p + 500 < len(entries) else END,
                         entries[p:p + 500])
    files.close()
    del scan, entries, items
    join = IndexJoin(tmp_path)
    join.index_dir = index_dir
    tracemalloc.start()
    try:
        join.build(4, None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    try:
        assert join.records() == 2 * n
        assert {i: why for i, _f, why in join.suspects(b"", 100)} == want
    finally:
        join.close()
    assert peak < 1_000_000, peak  # the records alone would be > 4 MB of Python objects
