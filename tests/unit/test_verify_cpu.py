"""verify's per-item CPU work, made cheaper, gives the same answers as the plain helpers it
replaces: the recorder's inlined record against one built from ``key_hash``/``digest``/
``KeyMapper.content``/``identity``; a template's ``str.format`` fast path against the loop;
the kept last parse and last shard digest against fresh ones (interleaved, mutated)."""

from __future__ import annotations

import hashlib
import pathlib
import time

import pytest
from hypothesis import given, settings, strategies as st

from reshard.core import layout as layout_mod
from reshard.core.join import MISPLACED, NEW, OLD, Record, Recorder, digest, fields_text, ident_hash, key_hash
from reshard.core.layout import (NEW_COPY_ATTR, SOURCE_ATTR, TOMBSTONE_ATTR, VERSION_ATTR, KeyMapper, Template,
                                 hash_shard, is_tombstone, scalar, text_of)
from reshard.core.migration import SHARD, TemplatePart, load, parse
from reshard.core.versions import version_of
from reshard.errors import UnmappableItem
from reshard.jobs.records import END, TRASH_PREFIX, SegmentFiles, complete, discard, run_dir

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = """\
id = "spec"
table = "Things"
[keys]
partition = "PK"
sort = "SK"
[from]
partition = "T{{x}}#{tenant}#{shard:03d}"
sort = "{n}#{name}"
shards = 7
shard_by = ["name", "n"]
hash = "md5"
[to]
partition = "T{{x}}#{tenant}#{shard:03d}"
sort = "{n}#{name}"
shards = 13
shard_by = ["name", "n"]
hash = "sha256"
"""
MAPPERS = {
    "sensor": KeyMapper(load(ROOT / "migrations" / "0001_sensor_events.toml")),
    "invoices": KeyMapper(load(ROOT / "migrations" / "0002_invoices.toml")),  # random old layout
    "hourly": KeyMapper(load(ROOT / "migrations" / "0003_sensor_hourly.toml")),  # derived bucket
    "spec": KeyMapper(parse(SPEC, "spec.toml")),  # braces, a padded shard, a number in a string key
}

text = st.text(st.characters(blacklist_characters="#", blacklist_categories=("Cs",)), min_size=1, max_size=8)
scalars = st.one_of(st.builds(lambda s: {"S": s}, st.text(max_size=6)),
                    st.builds(lambda n: {"N": str(n)}, st.integers(-10**30, 10**30)),
                    st.builds(lambda d: {"N": str(d)}, st.decimals(allow_nan=False, allow_infinity=False, places=3)),
                    st.builds(lambda b: {"B": b}, st.binary(max_size=4)), st.just({"NULL": True}),
                    st.builds(lambda b: {"BOOL": b}, st.booleans()))
wire = st.recursive(scalars, lambda inner: st.one_of(
    st.builds(lambda xs: {"L": xs}, st.lists(inner, max_size=3)),
    st.builds(lambda d: {"M": d}, st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    st.builds(lambda xs: {"SS": sorted(set(xs))}, st.lists(st.text(max_size=3), min_size=1, max_size=3)),
    st.builds(lambda xs: {"BS": xs}, st.lists(st.binary(max_size=3), min_size=1, max_size=3)),
    st.builds(lambda xs: {"NS": [str(x) for x in xs]}, st.lists(st.integers(), min_size=1, max_size=3))),
    max_leaves=6)


def logical(kind: str, draw) -> dict:
    """A logical item (wire) of the migration ``kind``: its key fields and some content."""
    if kind == "sensor":
        # ts is the identity sort key: a string, or a number ("1.0" and "1" are one identity)
        ts = draw(st.one_of(st.builds(lambda s: {"S": s}, text), st.builds(
            lambda d: {"N": str(d)}, st.decimals(allow_nan=False, allow_infinity=False, places=1))))
        item = {"sensor_id": {"S": draw(text)}, "ts": ts, "event_id": {"S": draw(text)}}
    elif kind == "invoices":
        item = {"invoice_number": {"S": draw(text)}, "line": {"S": draw(text)}}
    elif kind == "hourly":
        item = {"sensor_id": {"S": draw(text)},
                "ts": {"S": f"2024-10-{draw(st.integers(1, 28)):02d}T{draw(st.integers(0, 23)):02d}:00:00Z"}}
    else:
        item = {"tenant": {"S": draw(text)}, "name": {"S": draw(text)}, "n": {"N": str(draw(st.integers(0, 999)))}}
    # Content under names of its own ("c" first: never a key field, key attribute or _rs_ name).
    item.update(draw(st.dictionaries(st.builds(lambda n: "c" + n, st.text(max_size=4)), wire, max_size=4)))
    return item


def reference(r: Recorder, item: dict, side: int, values: dict | None, new_key: dict | None = None) -> Record:
    """The record as the recorder built it before it was inlined (the plain helpers)."""
    m = r.mapper
    key = key_hash(item, r.attrs)
    if values is None:
        return Record(key, None, side, version_of(item), not is_tombstone(item), kslot=r.key_slot(item, key))
    layout = m.old if side == OLD else m.new
    nkey = key if side == NEW else key_hash(new_key if new_key is not None else m.new.key(values), r.attrs)
    dig = None if is_tombstone(item) else digest(m.content(item, layout))
    flag = False
    if side == OLD and nkey == key and m.old.random and dig is not None:
        flag = dig != digest(m.content(item, m.new))
    if side == OLD:
        cslot = key if not m.old.random else r.slot(values)
        kslot = cslot
    else:
        cslot, kslot = r.slot(values), r.key_slot(item, key)
    ttl = item.get(r.ttl_attribute, {}).get("N") if r.ttl_attribute else None
    return Record(key, ident_hash(m.identity(values)), side, version_of(item), not is_tombstone(item), dig, ttl,
                  nkey, cslot, kslot, flag, fields_text(values))


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_the_recorder_gives_the_records_of_the_plain_helpers(data):
    """Old copies (any shard of a random layout), their new copies, tombstones, versions, TTLs,
    nested maps, lists, sets, binaries and numbers in the content; each side as verify scans it."""
    kind = data.draw(st.sampled_from(sorted(MAPPERS)))
    m = MAPPERS[kind]
    r = Recorder(m, ttl_attribute=data.draw(st.sampled_from([None, "expires_at"])))
    item = logical(kind, data.draw)
    if data.draw(st.booleans()):
        item["expires_at"] = {"N": str(data.draw(st.integers(0, 2**33)))}
    shard = data.draw(st.integers(0, m.old.shards - 1)) if m.old.random else None
    old = m.to_physical(item, m.old, shard)
    if data.draw(st.booleans()):
        old[VERSION_ATTR] = {"S": f"17000000{data.draw(st.integers(10000, 99999))}.000000.a"}
    if data.draw(st.booleans()):
        old[SOURCE_ATTR] = {"S": "x"}
    if data.draw(st.booleans()):
        # A tombstone: its keys and the key fields it stores, nothing else.
        old = {**{a: v for a, v in old.items() if a in m.old.key_attrs or a in m.key_fields},
               VERSION_ATTR: {"S": "1"}, TOMBSTONE_ATTR: {"BOOL": True}}
    fields = m.fields(old, m.old)
    new_key = m.new.key(fields)
    assert r.record(old, OLD, fields, new_key) == reference(r, old, OLD, fields, new_key)
    assert r.record(old, OLD, fields) == reference(r, old, OLD, fields)
    assert r.record(old, OLD, None) == reference(r, old, OLD, None)
    copy, moved = m.remap(old)
    if moved:
        assert copy[NEW_COPY_ATTR]
        values = m.fields(copy, m.new)
        assert r.record(copy, NEW, values) == reference(r, copy, NEW, values)
        assert r.record(copy, MISPLACED, values) == reference(r, copy, MISPLACED, values)


def loop_format(t: Template, values: dict) -> dict:
    """``Template.format`` as the loop (every value through ``text_of`` or its spec)."""
    if t.identity:
        return t.format(values)
    out = []
    for p in t.parts:
        if p.field is None:
            out.append(p.literal)
            continue
        if p.field not in values:
            raise UnmappableItem("missing-field", p.field)
        v = scalar(values[p.field]) if isinstance(values[p.field], dict) else values[p.field]
        out.append(format(v, p.spec) if p.spec else text_of(v, p.field))
    return {"S": "".join(out)}


def outcome(f, *args):
    try:
        return f(*args)
    except (UnmappableItem, ValueError, TypeError) as e:
        return type(e)


TEMPLATES = [
    Template((TemplatePart(literal="a{b}#"), TemplatePart(field="x"), TemplatePart(literal="#"),
              TemplatePart(field=SHARD, spec="03d")), "a{{b}}#{x}#{shard:03d}"),
    Template((TemplatePart(field="x"), TemplatePart(literal="}"), TemplatePart(field="y", spec=">4")), "{x}}}{y:>4}"),
    Template((TemplatePart(field="x"), TemplatePart(literal="#"), TemplatePart(field="x")), "{x}#{x}"),
]
field_values = st.one_of(st.text(max_size=5), st.integers(-10**20, 10**20), st.booleans(), st.binary(max_size=3),
                         st.decimals(allow_nan=False, allow_infinity=False, places=2),
                         st.builds(lambda s: {"S": s}, st.text(max_size=3)),
                         st.builds(lambda n: {"N": str(n)}, st.integers()))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(range(len(TEMPLATES))), st.dictionaries(st.sampled_from(["x", "y", SHARD]), field_values))
def test_the_format_fast_path_formats_as_the_loop(which, values):
    """str, int, Decimal (integral or not), bool, bytes, wire values, missing fields, braces in
    literals, specs: the same text, or the same refusal."""
    t = TEMPLATES[which]
    assert outcome(t.format, values) == outcome(loop_format, t, values)


def test_the_kept_last_parse_is_a_fresh_dict_and_refusals_are_not_kept():
    m = MAPPERS["sensor"]
    item = m.to_physical({"sensor_id": {"S": "s-1"}, "ts": {"S": "t"}, "event_id": {"S": "e"}}, m.old)
    first = m.old.partition.parse(item["PK"])
    first["sensor_id"] = "changed"  # Layout.parse adds to (and fields() pops from) what parse returns
    assert m.old.partition.parse(item["PK"]) == {"sensor_id": "s-1", SHARD: m.old.shard_for({"event_id": "e"})}
    with pytest.raises(UnmappableItem):
        m.old.partition.parse({"S": "s-1#03"})  # does not round-trip
    with pytest.raises(UnmappableItem):
        m.old.partition.parse({"S": "s-1#03"})  # refused again, not answered from the last parse
    assert m.fields(item, m.old)["sensor_id"] == "s-1"


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "é", ""]), st.sampled_from(["sha256", "md5", "jump"]),
                          st.integers(1, 100)), max_size=12))
def test_the_kept_last_shard_digest_answers_as_a_fresh_hash(calls):
    """Interleaved values, algorithms and shard counts (the last digest kept is per value AND
    algorithm)."""
    for value, algorithm, shards in calls:
        if algorithm == "jump":
            expected = layout_mod.jump_hash(int.from_bytes(hashlib.sha256(value.encode()).digest()[:8], "big"),
                                            shards)
        else:
            expected = int(hashlib.new(algorithm, value.encode()).hexdigest(), 16) % shards
        assert hash_shard(value, shards, algorithm) == expected
    assert layout_mod.jump_key("a") == int.from_bytes(hashlib.sha256(b"a").digest()[:8], "big")


def test_a_finished_runs_records_leave_its_path_at_once_and_are_removed_after(tmp_path):
    """``records.discard``: the run's directory is renamed aside before the verdict returns (its
    SQLite files closed without copying their WAL), removed by a background thread; a
    ``.trash-`` directory left by a process killed meanwhile goes with the next run here."""
    run = run_dir(tmp_path, "ctl", "mig", 1, "started-1")
    files = SegmentFiles(run)
    files.write_page(0, END, END, [Record(b"k" * 16, b"i" * 16, OLD, "", True, b"d" * 16)], 1)
    assert (run / "seg-00000.sqlite-wal").exists()
    discard(files, run)
    assert not run.exists()
    deadline = time.monotonic() + 10
    while any(run.parent.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert list(run.parent.iterdir()) == []
    leftover = run.parent / (TRASH_PREFIX + "run-000001-x")
    (leftover / "deep").mkdir(parents=True)
    kept = run_dir(tmp_path, "ctl", "mig", 2, "started-2")
    assert not leftover.exists() and kept.exists()
    files = SegmentFiles(kept)
    files.write_page(0, END, END, [], 1)
    discard(files, None)  # a directory the caller keeps: closed, left where it is
    assert complete(kept, 0)
