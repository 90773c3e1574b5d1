"""verify's pure judgement (core/compare.py): every old copy, TTL, collisions, too-large, the verdict."""

from __future__ import annotations

import pathlib

import pytest

from reshard.core.compare import TTL_MAX_AGE_SECONDS, classify, expired, failing, judge, passes
from reshard.core.layout import NEW_COPY_ATTR, KeyMapper
from reshard.core.migration import load
from reshard.core.planning import SampleAnalysis

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0


@pytest.fixture(scope="module")
def invoices():
    return KeyMapper(load(ROOT / "migrations" / "0002_invoices.toml"))


@pytest.fixture(scope="module")
def sensor():
    return KeyMapper(load(ROOT / "migrations" / "0001_sensor_events.toml"))


def old_copy(mapper, shard, amount, version=None, **extra):
    item = {"invoice_number": {"S": "121212"}, "line": {"S": "3"}, "amount": {"N": str(amount)}, **extra}
    if version:
        item["_rs_v"] = {"S": version}
    return mapper.to_physical(item, mapper.old, shard)


def tomb(mapper, shard, version):
    key = mapper.to_physical({"invoice_number": {"S": "121212"}, "line": {"S": "3"}}, mapper.old, shard)
    return dict(key, _rs_v={"S": version}, _rs_del={"BOOL": True})


def new_copy(mapper, old):
    item, moved = mapper.remap(old)
    if not moved:
        item[NEW_COPY_ATTR] = {"S": mapper.migration.id}
    return item


V1, V2 = "1700000000000.000000.a", "1700000000001.000000.b"


def test_the_newest_old_copy_is_the_reference(invoices):
    older, newer = old_copy(invoices, 2, 1), old_copy(invoices, 7, 2, V1)
    j = judge(invoices, [older, newer], new_copy(invoices, newer))
    assert j.kind is None and j.reference is newer and j.old_copies == 2
    # The new copy holds the older copy's content: stale, judged against the newest.
    assert judge(invoices, [older, newer], new_copy(invoices, older)).kind == "stale"


def test_a_newer_tombstone_on_another_shard_makes_a_live_new_copy_resurrected(invoices):
    """The case verify missed: the copy it compared agreed, the newest copy (a delete) did not."""
    live, deleted = old_copy(invoices, 2, 1), tomb(invoices, 7, V1)
    assert judge(invoices, [live, deleted], new_copy(invoices, live)).kind == "resurrected"
    assert judge(invoices, [live, deleted], None).kind is None  # deleted everywhere: agrees


def test_unversioned_copies_with_other_content_collide_equal_ones_do_not(invoices):
    a, b = old_copy(invoices, 2, 1), old_copy(invoices, 7, 2)
    j = judge(invoices, [a, b], new_copy(invoices, a))
    assert j.kind == "collision" and "2 old copies" in j.detail
    same = old_copy(invoices, 7, 1)
    assert judge(invoices, [a, same], new_copy(invoices, a)).kind is None
    # A newer version settles it: the newest wins, whatever the others hold.
    c = old_copy(invoices, 4, 3, V1)
    assert judge(invoices, [a, b, c], new_copy(invoices, c)).kind is None


def test_expired_copies_are_absent(invoices):
    gone = {"expires_at": {"N": str(int(NOW) - 60)}}
    a = old_copy(invoices, 2, 1, **gone)
    kw = dict(ttl_attribute="expires_at", now=NOW)
    assert judge(invoices, [a], None, **kw).kind is None            # new copy already deleted by TTL
    assert judge(invoices, [], new_copy(invoices, a), **kw).kind is None  # old copy already deleted by TTL
    assert judge(invoices, [a], None).kind == "missing"              # without TTL: a real difference
    later = {"expires_at": {"N": str(int(NOW) + 60)}}
    b = old_copy(invoices, 2, 1, **later)
    assert judge(invoices, [b], None, **kw).kind == "missing"        # not yet expired: still compared


def test_what_ttl_never_deletes_is_not_expired():
    at = {"expires_at": {"N": str(int(NOW) - 10)}}
    assert expired(at, "expires_at", NOW)
    assert not expired(at, None, NOW) and not expired(at, "ttl", NOW)
    assert not expired({"expires_at": {"S": "1"}}, "expires_at", NOW)                # not a number
    assert not expired({"expires_at": {"N": str(int(NOW) * 1000)}}, "expires_at", NOW)  # milliseconds
    too_old = {"expires_at": {"N": str(int(NOW - TTL_MAX_AGE_SECONDS) - 10)}}
    assert not expired(too_old, "expires_at", NOW)                                    # > 5 years: ignored


def test_a_shim_write_newer_than_every_old_copy_is_new_only(invoices):
    a = old_copy(invoices, 2, 1)
    shim_write = dict(new_copy(invoices, a), _rs_v={"S": V2})
    assert judge(invoices, [], shim_write).kind == "new_only"
    assert judge(invoices, [tomb(invoices, 2, V1)], shim_write).kind == "new_only"
    assert judge(invoices, [tomb(invoices, 2, V2 + "z")], shim_write).kind == "resurrected"
    assert judge(invoices, [], new_copy(invoices, a)).kind == "extra"  # unversioned: a stray copy


def test_an_item_too_large_for_the_new_layout(sensor):
    fields = {"sensor_id": {"S": "s-1"}, "event_id": {"S": "e-1"}, "ts": {"S": "2024-10-27T15:00:00Z"}}
    old = sensor.to_physical(dict(fields, blob={"S": "x"}), sensor.old)
    from reshard.core.layout import MAX_ITEM_BYTES, item_size
    old["blob"] = {"S": "x" * (MAX_ITEM_BYTES - item_size(old) - 2)}
    assert item_size(old) <= MAX_ITEM_BYTES
    if not sensor.moves(old):
        pytest.skip("this event does not move")
    j = judge(sensor, [old], None)
    assert j.kind == "too_large" and "shrink" in j.detail
    assert classify(sensor, old, None) == "missing"


def test_the_verdict_counts_unmappable_items_as_failing():
    assert passes({"checked": 10}, True)
    assert not passes({"checked": 10}, False)
    assert not passes({"checked": 10, "unmappable": 10}, True)
    assert failing({"unmappable": 3, "missing": 0}) == {"unmappable": 3}
    assert passes({"unmappable": 3}, True, allow_unmappable=3)  # the hook of a later --allow-unmappable
    assert not passes({"unmappable": 4}, True, allow_unmappable=3)
    assert not passes({"too_large": 1, "unmappable": 0}, True)
    assert passes({"old_copies": 5}, True)  # information only


def test_plan_counts_collisions_and_lets_the_newest_win(invoices):
    a = SampleAnalysis(invoices)
    a.observe(old_copy(invoices, 2, 1))
    a.observe(old_copy(invoices, 5, 1))        # same content: a plain duplicate
    a.observe(old_copy(invoices, 7, 2))        # other content, no version: a collision
    assert a.collisions == 1 and len(a.collision_examples) == 1
    ex = a.collision_examples[0]
    assert [k["PK"] for k in ex["keys"]] == ["InvoiceNumber#121212#2", "InvoiceNumber#121212#7"]
    a.observe(old_copy(invoices, 9, 3, V1))    # newer: wins, not a collision
    assert a.collisions == 1


def sensor_16_to_24():
    """The sensor migration with 24 new shards: a moved item's new shard can be an old one."""
    from reshard.core.migration import parse
    text = (ROOT / "migrations" / "0001_sensor_events.toml").read_text()
    return KeyMapper(parse(text.replace("shards = 32", "shards = 24"), "<16-to-24>"))


def overlapping_events(sensor):
    """Two events of one sensor in one millisecond where the first one's new key is the
    second one's old key (the new layout hashes event_id over 24 shards, the old over 16)."""
    from reshard.core.layout import hash_shard
    ids = [f"e-{i}" for i in range(400)]
    for e1 in ids:
        b = hash_shard(e1, sensor.new.shards)
        if b < 16 and b != hash_shard(e1, 16):
            e2 = next(e for e in ids if e != e1 and hash_shard(e, 16) == b)
            return e1, e2
    raise AssertionError("no pair")


def test_plan_finds_an_item_whose_new_key_is_another_items_old_key():
    sensor = sensor_16_to_24()
    e1, e2 = overlapping_events(sensor)
    item = lambda e, t: sensor.to_physical(  # noqa: E731
        {"sensor_id": {"S": "s-1"}, "event_id": {"S": e}, "ts": {"S": "2024-10-27T15:00:00.123Z"},
         "temp": {"N": t}}, sensor.old)
    for order in ((e1, e2), (e2, e1)):  # whichever the scan meets first
        a = SampleAnalysis(sensor)
        for e in order:
            a.observe(item(e, "1"))
        assert a.collisions == 1, order
        assert sensor.new.key(sensor.fields(item(e1, "1"), sensor.old)) == \
            {k: item(e2, "1")[k] for k in ("PK", "SK")}


def test_a_run_that_sent_a_repair_never_passes_even_with_no_difference_counted():
    # repair_pages: the run row's count of pages that repaired (a redone page's counters miss them)
    assert not passes({"checked": 10, "repair_pages": 1}, True)
    assert passes({"checked": 10, "repair_pages": 0}, True)
