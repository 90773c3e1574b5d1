"""Issue 13: every key shape parses and maps; what `start` refuses (planning.blockers), pure."""

from __future__ import annotations

from decimal import Decimal

import pytest

from reshard.core import planning
from reshard.core.layout import MAX_ITEM_BYTES, KeyMapper, item_size
from reshard.core.migration import parse
from reshard.errors import MigrationFileError


def text(keys: str, frm: str, to: str) -> str:
    return f'id = "m"\ntable = "Tbl"\n[keys]\n{keys}\n[from]\n{frm}\n[to]\n{to}\n'


def test_a_table_without_a_sort_key_parses_and_maps():
    """Literal template parts have field None, which matched keys.sort = None ("field {None}")."""
    m = parse(text('partition = "pk"', 'partition = "{device_id}#{shard}"\nshards = 4\nshard_by = ["device_id"]',
                   'partition = "dev#{device_id}#{shard}"\nshards = 8\nshard_by = ["device_id"]'))
    mapper = KeyMapper(m)
    old = mapper.to_physical({"device_id": {"S": "d1"}, "v": {"N": "1"}}, mapper.old)
    assert set(old) == {"pk", "device_id", "v"}
    new, moved = mapper.remap(old)
    assert moved and new["pk"]["S"].startswith("dev#d1#")
    assert mapper.to_logical(new, mapper.new) == {"device_id": {"S": "d1"}, "v": {"N": "1"}}


@pytest.mark.parametrize("frm_sort,to_sort", [("", ""), ('sort = "{SK}"\n', ""), ("", 'sort = "{SK}"\n')])
def test_a_sort_key_kept_as_is_is_a_field_shard_by_may_name(frm_sort, to_sort):
    m = parse(text('partition = "PK"\nsort = "SK"',
                   f'partition = "{{sensor_id}}#{{shard}}"\n{frm_sort}shards = 4\nshard_by = ["SK"]',
                   f'partition = "{{sensor_id}}#{{shard}}"\n{to_sort}shards = 8\nshard_by = ["SK"]'))
    mapper = KeyMapper(m)
    assert mapper.key_fields == ("sensor_id", "SK")
    logical = {"sensor_id": {"S": "s"}, "SK": {"N": "1700000000123"}, "t": {"N": "2"}}
    old = mapper.to_physical(logical, mapper.old)
    assert old["SK"] == {"N": "1700000000123"}  # the number stays a number
    new, _ = mapper.remap(old)
    assert mapper.to_logical(new, mapper.new) == logical  # the names the application wrote


def test_a_partition_key_kept_as_is_and_the_misuse_of_a_key_name():
    parse(text('partition = "PK"\nsort = "SK"', 'partition = "{PK}"\nsort = "{shard}#{ts}"\nshards = 2\nshard_by = ["ts"]',
               'partition = "{PK}"\nsort = "{shard}#{ts}"\nshards = 4\nshard_by = ["ts"]'))
    for frm in ('partition = "{PK}#{shard}"\nsort = "{ts}"', 'partition = "{SK}"\nsort = "{shard}#{ts}"'):
        with pytest.raises(MigrationFileError, match="is a physical key attribute name"):
            parse(text('partition = "PK"\nsort = "SK"', frm + '\nshards = 2\nshard_by = ["ts"]',
                       'partition = "{x}#{shard}"\nsort = "{ts}"\nshards = 4\nshard_by = ["ts"]'))


SENSOR = text('partition = "PK"\nsort = "SK"',
              'partition = "{sensor_id}#{shard}"\nsort = "{ts}"\nshards = 2\nshard_by = ["event_id"]',
              'partition = "{sensor_id}#{shard}"\nsort = "{ts}"\nshards = 4\nshard_by = ["event_id"]')


def analysed(items) -> planning.SampleAnalysis:
    a = planning.SampleAnalysis(KeyMapper(parse(SENSOR)))
    for i in items:
        a.observe(i)
    return a


def good(i: int) -> dict:
    mapper = KeyMapper(parse(SENSOR))
    return mapper.to_physical({"sensor_id": {"S": "s"}, "event_id": {"S": f"e{i}"}, "ts": {"S": f"t{i}"}}, mapper.old)


def test_blockers_template_matching_nothing_no_allowance_helps():
    a = analysed([{"PK": {"S": f"sensor-x#{i}"}, "SK": {"S": "t"}} for i in range(3)])
    for allowance in (0, 10**6):
        (line,) = planning.blockers(a, allowance)
        assert line.startswith("no sampled item fits the [from] layout (3 of 3 unmappable, e.g. PK='sensor-x#")


def test_blockers_unmappable_within_the_allowance_pass():
    a = analysed([good(i) for i in range(5)] + [{"PK": {"S": "s#1"}, "SK": {"S": "x"}, "sensor_id": {"S": "s"}}])
    (line,) = planning.blockers(a, 0)
    assert "1 sampled item(s) cannot be mapped (missing-field: 1; e.g. PK='s#1'" in line
    assert "--allow-unmappable N (N at least 1" in line
    assert planning.blockers(a, 1) == []
    assert planning.blockers(analysed([good(i) for i in range(5)])) == []


def test_blockers_too_large_blocks_whatever_the_allowance():
    """Size growth: an item at the 400 KB limit whose copy adds the new-copy marker."""
    mapper = KeyMapper(parse(SENSOR))
    i = next(i for i in range(100) if mapper.moves(good(i)))
    base = dict(good(i), blob={"S": ""})
    big = dict(base, blob={"S": "x" * (MAX_ITEM_BYTES - item_size(base))})
    assert item_size(big) == MAX_ITEM_BYTES
    a = analysed([good(i + 1), big])
    assert a.unmappable == {"too-large": 1}
    for allowance in (0, 5):
        (line,) = planning.blockers(a, allowance)
        assert "1 sampled item(s) would exceed DynamoDB's 400 KB item limit after re-keying" in line
        assert "they would block cutover" in line


def test_blockers_collisions_are_listed_with_both_old_keys():
    """Random-suffix pairs: two events of one sensor in one millisecond under two suffixes; the
    new layout keys on sensor and timestamp, so both map to one new key."""
    m = parse(text('partition = "PK"\nsort = "SK"',
                   'partition = "{sensor_id}#{shard}"\nsort = "{ts}"\nshards = 4\nshard_by = "random"',
                   'partition = "{sensor_id}#{shard}"\nsort = "{ts}"\nshards = 8\nshard_by = ["sensor_id", "ts"]'))
    a = planning.SampleAnalysis(KeyMapper(m))
    for pk, event in (("s-1#0", "a"), ("s-1#3", "b"), ("s-2#1", "c")):
        a.observe({"PK": {"S": pk}, "SK": {"S": "2024-10-27T10:00:00.001Z"}, "event_id": {"S": event}})
    assert a.collisions == 1
    (line,) = planning.blockers(a, 99)  # the allowance is for unmappable items, not collisions
    assert line.startswith("1 sampled old item(s) map to the same new key as another old item (e.g. "
                           "PK='s-1#0', SK='2024-10-27T10:00:00.001Z' and PK='s-1#3', SK='2024-10-27T10:00:00.001Z' -> PK='s-1#")
