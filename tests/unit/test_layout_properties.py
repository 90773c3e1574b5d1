"""Key layouts: hypothesis properties (round-trips, one shard per item, determinism,
bit-exact hashes) and the moves helper on the example migrations."""

from __future__ import annotations

import hashlib
import pathlib

import pytest
from hypothesis import example, given, settings, strategies as st

from reshard.core import migration
from reshard.errors import UnmappableItem
from reshard.core.layout import KeyMapper, hash_shard

ROOT = pathlib.Path(__file__).resolve().parents[2]
SENSOR = ROOT / "migrations" / "0001_sensor_events.toml"
INVOICES = ROOT / "migrations" / "0002_invoices.toml"
HOURLY = ROOT / "migrations" / "0003_sensor_hourly.toml"

TWO_FIELDS = """\
id = "p"
table = "Things"
[keys]
partition = "PK"
sort = "SK"
[from]
partition = "{tenant}#{shard:02d}"
sort = "{kind}#{name}"
shards = {n}
shard_by = ["name"]
hash = "{hash}"
[to]
partition = "{tenant}#{shard:02d}"
sort = "{kind}#{name}"
shards = {m}
shard_by = ["name"]
hash = "{hash}"
"""


def two_fields(n: int = 7, m: int = 14, hash: str = "sha256") -> KeyMapper:
    text = TWO_FIELDS.replace("{n}", str(n)).replace("{m}", str(m)).replace('"{hash}"', f'"{hash}"')
    return KeyMapper(migration.parse(text, "props.toml"))


def sha(s: str) -> int:
    return int(hashlib.sha256(s.encode()).hexdigest(), 16)


def md5(s: str) -> int:
    return int(hashlib.md5(s.encode()).hexdigest(), 16)


MAPPER = two_fields()
plain = st.text(st.characters(blacklist_characters="#", blacklist_categories=("Cs",)), max_size=20)
anything = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
with_sep = st.builds(lambda a, b: f"{a}#{b}", anything, anything)


@settings(max_examples=150, deadline=None)
@given(tenant=plain, kind=plain, name=plain)
def test_parse_format_round_trip(tenant, kind, name):
    layout = MAPPER.old
    values = {"tenant": tenant, "kind": kind, "name": name}
    key = layout.key(values)
    parsed = layout.parse(key)
    assert parsed.pop("shard") == hash_shard(name, 7)
    assert parsed == values


@settings(max_examples=200, deadline=None)
@given(tenant=anything, kind=st.one_of(anything, with_sep), name=st.one_of(anything, with_sep))
@example(tenant="t", kind="a#b", name="c")   # "a#b#c": kind="a", name="b#c" would also format the same
@example(tenant="t", kind="a", name="b#c")
def test_separators_in_values_are_refused_never_misparsed(tenant, kind, name):
    """A value holding the separator either parses back exactly or is refused as unmappable."""
    layout = MAPPER.old
    values = {"tenant": tenant, "kind": kind, "name": name}
    key = layout.key(values)
    try:
        parsed = layout.parse(key)
    except UnmappableItem as e:
        assert e.reason == "unparseable-key"
        assert "#" in kind or "#" in name
        return
    parsed.pop("shard")
    assert parsed == values


def test_ambiguous_sort_key_is_refused_with_a_reason():
    key = MAPPER.old.key({"tenant": "t", "kind": "a#b", "name": "c"})
    assert key["SK"] == {"S": "a#b#c"}
    with pytest.raises(UnmappableItem) as info:
        MAPPER.old.parse(key)
    assert info.value.reason == "unparseable-key" and "ambiguous" in info.value.detail
    # A separator where only one split exists is fine: the shard is digits only.
    k = MAPPER.old.key({"tenant": "a#b", "kind": "k", "name": "n"})
    assert MAPPER.old.parse(k)["tenant"] == "a#b"


@settings(max_examples=150, deadline=None)
@given(name=anything, n=st.integers(1, 1000), algorithm=st.sampled_from(["sha256", "md5"]))
def test_hash_bit_exact(name, n, algorithm):
    expected = (sha if algorithm == "sha256" else md5)(name) % n
    assert hash_shard(name, n, algorithm) == expected


@settings(max_examples=100, deadline=None)
@given(tenant=plain, kind=plain, name=plain, n=st.integers(1, 99), algorithm=st.sampled_from(["sha256", "md5"]))
def test_every_item_maps_to_exactly_one_shard_in_range(tenant, kind, name, n, algorithm):
    mapper = two_fields(n, n + 1, algorithm)
    values = {"tenant": tenant, "kind": kind, "name": name}
    keys = mapper.old.candidate_keys(values)
    assert len(keys) == 1
    shard = mapper.old.shard_for(values)
    assert 0 <= shard < n
    assert shard == (sha if algorithm == "sha256" else md5)(name) % n
    assert keys[0]["PK"] == {"S": f"{tenant}#{shard:02d}"}


@settings(max_examples=100, deadline=None)
@given(tenant=plain, kind=plain, name=plain)
def test_same_input_same_key_across_mappers(tenant, kind, name):
    """Two independently built mappers (the shim's and the backfill's) agree on every key."""
    other = two_fields()
    values = {"tenant": tenant, "kind": kind, "name": name}
    assert MAPPER.new.key(values) == other.new.key(dict(values))
    old_item = {**MAPPER.old.key(values), "payload": {"S": "x"}}
    assert MAPPER.remap(old_item) == other.remap(dict(old_item))


@settings(max_examples=50, deadline=None)
@given(line=anything, invoice=st.integers(0, 10**9), shard=st.integers(0, 9))
def test_random_layout_every_shard_is_a_candidate(line, invoice, shard):
    mapper = KeyMapper(migration.load(INVOICES))
    values = {"invoice_number": str(invoice), "line": line}
    keys = mapper.old.candidate_keys(values)
    assert [k["PK"]["S"] for k in keys] == [f"InvoiceNumber#{invoice}#{s}" for s in range(10)]
    item = {**keys[shard], "amount": {"N": "5"}}
    new, moved = mapper.remap(item)
    new_shard = md5(f"{invoice}#{line}") % 20
    assert new["PK"] == {"S": f"InvoiceNumber#{invoice}#{new_shard}"}
    assert moved == (new_shard != shard)


def test_n_to_2n_moves_exactly_the_items_whose_hash_changes():
    """16 -> 32, same hash: an item stays iff h % 32 == h % 16, i.e. bit 4 of h is 0."""
    mapper = KeyMapper(migration.load(SENSOR))
    events = [f"evt-{i}" for i in range(400)]
    items = {e: {"PK": {"S": f"sensor-1#{sha(e) % 16}"}, "SK": {"S": f"2024-10-27T15:00:{i % 60:02d}Z"},
                 "sensor_id": {"S": "sensor-1"}, "event_id": {"S": e}} for i, e in enumerate(events)}
    moved = {e for e, item in items.items() if mapper.moves(item)}
    assert moved == {e for e in events if sha(e) % 32 != sha(e) % 16}
    assert moved == {e for e in events if (sha(e) >> 4) & 1}
    assert 160 <= len(moved) <= 240  # about half, as a sanity bound on the exact set above
    for e in events:
        new, did_move = mapper.remap(items[e])
        assert did_move == (e in moved)
        assert new["PK"] == {"S": f"sensor-1#{sha(e) % 32}"}
        assert new["SK"] == items[e]["SK"]


def test_hybrid_fields_come_back_from_the_keys():
    """Hourly items store only event_id and readings: sensor_id and ts are parsed from SK."""
    mapper = KeyMapper(migration.load(HOURLY))
    ts = "2024-10-27T15:04:05.123456Z"
    item = {"PK": {"S": f"{sha('sensor-alpha-001') % 16}#2024-10-27T15"},
            "SK": {"S": f"sensor-alpha-001#{ts}"},
            "event_id": {"S": "e-1"}, "temperature": {"N": "21.5"}}
    assert mapper.fields(item, mapper.old) == {"sensor_id": "sensor-alpha-001", "ts": ts}
    logical = mapper.to_logical(item, mapper.old)
    assert logical == {"event_id": {"S": "e-1"}, "temperature": {"N": "21.5"},
                       "sensor_id": {"S": "sensor-alpha-001"}, "ts": {"S": ts}}
    new, moved = mapper.remap(item)
    assert new["PK"] == {"S": f"{sha('sensor-alpha-001') % 64}#2024-10-27T15"}
    assert new["SK"] == item["SK"]
    assert moved == (sha("sensor-alpha-001") % 64 != sha("sensor-alpha-001") % 16)
    # The bucket in the key must agree with the timestamp in the sort key.
    wrong = dict(item, PK={"S": f"{sha('sensor-alpha-001') % 16}#2024-10-27T16"})
    with pytest.raises(UnmappableItem) as info:
        mapper.fields(wrong, mapper.old)
    assert info.value.reason == "unparseable-key"

