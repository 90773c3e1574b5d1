"""Index verify's join: what the scan says the GSI must hold, what the fan-out read from it (pure).

Verify of an ``[index.NAME]`` migration proves that the index, read the way cutover shims
read it (every ``[to]`` partition value of each logical partition, :func:`reshard.core.index.index_routing`),
returns exactly the items a scan of the table says carry the index. Both sides leave one
compact record per (index, table key), in the table verify's row shape
(:class:`reshard.core.join.Record`, so ``reshard.jobs.records`` spills, chains and merges
them unchanged) with these meanings:

=========  ===================================================================
``key``    hash of the table key
``ident``  hash of (index name, table key): what the join groups by
``side``   :data:`SCAN` (the table item) or :data:`ENTRY` (an index entry)
``version`` ``_rs_v`` ("" when unversioned)
``live``   not a tombstone
``digest`` hash of (GSI partition value, GSI sort value)
``ttl``    the index name and the item's logical partition of it (:func:`prefix_text`; scan
           rows): the index side queries each distinct one
``flag``   the fan-out must return it (scan rows: the item is live and at its ``[to]`` value)
``fields`` JSON: index name, table key, GSI partition and sort value (what a re-check queries)
=========  ===================================================================

One (index, table key) agrees when the scan has it once and the index returns it once
with the same partition value, sort value and version -- or, for an item the fan-out need
not return (a tombstone, a value off the ``[to]`` layout, which the scan already reports
as ``gsi_value``), not at all. Anything else is a suspect, re-checked after the settle
window against a consistent read of the item and a targeted index query (:func:`judge`).
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, Sequence

from reshard.core.index import NEW, IndexMapper
from reshard.core.join import Record, digest, fields_text, ident_hash, key_hash
from reshard.core.layout import is_tombstone, scalar
from reshard.core.versions import version_of
from reshard.core.wire import dump_key, key_of, load_key
from reshard.errors import UnmappableItem

#: Which side of the join a record is.
SCAN, ENTRY = 0, 1

#: The kinds of difference between the scan and the fan-out (``reshard.core.compare.KINDS``).
GSI_MISSING, GSI_EXTRA, GSI_DIFFERS = "gsi_missing", "gsi_extra", "gsi_differs"


def prefix_fields(m: IndexMapper) -> list[str]:
    """The item fields that fix the ``[to]`` layout's logical partition (the template's fields
    other than the shard, derived ones by their source): none for ``{shard}`` alone."""
    new = m.new
    return list(dict.fromkeys(new.derived[f].source if f in new.derived else f for f in new.template_fields))


def prefix_text(m: IndexMapper, item: Mapping[str, Any]) -> str | None:
    """The item's logical partition of the index as text (None: a field is missing, or is no
    string, number or binary: no partition value can be formed from it)."""
    values = {f: scalar(item[f]) if f in item else None for f in prefix_fields(m)}
    if any(v is None for v in values.values()):
        return None
    return fields_text(values)


def _partition(m: IndexMapper, item: Mapping[str, Any]) -> str | None:
    """The ``ttl`` column of a scan record: JSON [index name, :func:`prefix_text`] (None: no partition)."""
    prefix = prefix_text(m, item)
    return None if prefix is None else json.dumps([m.name, prefix])


def partition_of(text: str) -> tuple[str, str]:
    """(index name, prefix text) of a scan record's ``ttl`` column."""
    name, prefix = json.loads(text)
    return name, prefix


def _fields(m: IndexMapper, key: Mapping[str, Any], pv: Mapping | None, sort: Mapping | None) -> str:
    # The GSI keys as wire values (binary ones too: dump_key's encoding), None left out.
    keys = {k: v for k, v in (("p", pv), ("s", sort)) if v is not None}
    return json.dumps({"i": m.name, "k": dump_key(key), "g": dump_key(keys)}, sort_keys=True)


def _ident(m: IndexMapper, khash: bytes) -> bytes:
    return ident_hash((m.name, khash))


def expected(m: IndexMapper, item: Mapping[str, Any]) -> bool:
    """Whether the cutover fan-out must return ``item``: live, in the index, at its [to] value."""
    if is_tombstone(item) or not m.in_index(item):
        return False
    try:
        return m.is_at(item, NEW)
    except UnmappableItem:
        return False


def scan_record(m: IndexMapper, item: Mapping[str, Any], key_attrs: Sequence[str]) -> Record:
    """The record of a scanned table item that carries the index's attributes."""
    key = key_of(item, key_attrs)
    khash = key_hash(key, key_attrs)
    pv, sort = item.get(m.attr), item.get(m.sort_attr) if m.sort_attr else None
    return Record(khash, _ident(m, khash), SCAN, version_of(item), not is_tombstone(item),
                  digest({"p": pv, "s": sort}), _partition(m, item), flag=expected(m, item),
                  fields=_fields(m, key, pv, sort))


def entry_record(m: IndexMapper, entry: Mapping[str, Any], key_attrs: Sequence[str]) -> Record:
    """The record of an index entry a fan-out query returned (table keys, GSI keys, ``_rs_v``)."""
    key = key_of(entry, key_attrs)
    khash = key_hash(key, key_attrs)
    pv, sort = entry.get(m.attr), entry.get(m.sort_attr) if m.sort_attr else None
    return Record(khash, _ident(m, khash), ENTRY, version_of(entry), True, digest({"p": pv, "s": sort}),
                  fields=_fields(m, key, pv, sort))


def agrees(records: Iterable[Record]) -> bool:
    """The rule the join applies (in SQL, ``reshard.jobs.index_jobs.IndexJoin``) to one
    (index, table key): one scan record, and one matching entry or -- when the fan-out
    need not return the item -- none."""
    records = list(records)
    scans = [r for r in records if r.side == SCAN]
    entries = [r for r in records if r.side == ENTRY]
    if len(scans) != 1:
        return False
    s = scans[0]
    if not entries:
        return not s.flag
    return len(entries) == 1 and entries[0].digest == s.digest and entries[0].version == s.version


def verdict(records: Iterable[Record]) -> str:
    """The kind of a group that does not agree, as the records say before any re-check."""
    records = list(records)
    scans = [r for r in records if r.side == SCAN]
    entries = [r for r in records if r.side == ENTRY]
    if not scans:
        return GSI_EXTRA
    if not entries:
        return GSI_MISSING
    return GSI_EXTRA if len(entries) > 1 else GSI_DIFFERS


def targets(fields: Iterable[str]) -> tuple[str, dict, list[tuple]]:
    """From a suspect's rows (``fields`` JSON): (index name, table key, [(partition, sort)]
    where the join saw it), for the re-check's consistent read and targeted queries."""
    name, key, seen = "", "", []
    for text in fields:
        f = json.loads(text)
        name, key, g = f["i"], f["k"], load_key(f["g"])
        if "p" in g and (g["p"], g.get("s")) not in seen:
            seen.append((g["p"], g.get("s")))
    return name, load_key(key) if key else {}, seen


def _show(av: Mapping | None) -> str:
    if av is None:
        return "-"
    (_t, v), = av.items()
    return repr(v)


def judge(m: IndexMapper, item: Mapping[str, Any] | None, entries: Sequence[Mapping[str, Any]]) -> tuple[str | None, str]:
    """A suspect on a re-check: ``item`` is the table item read consistently (None: absent),
    ``entries`` the index entries of its table key the targeted queries returned.

    Returns ``(None, "")`` when they agree (the same rule as :func:`agrees`), else the kind
    and a one-line detail for the report.
    """
    carried = item is not None and m.in_index(item)
    want = expected(m, item) if item is not None else False
    got = [(e.get(m.attr), e.get(m.sort_attr) if m.sort_attr else None, version_of(e)) for e in entries]
    if carried:
        mine = (item.get(m.attr), item.get(m.sort_attr) if m.sort_attr else None, version_of(item))
        if got == [mine] or (not got and not want):
            return None, ""
        here = f"the item has {m.attr} = {_show(mine[0])}" + (f", {m.sort_attr} = {_show(mine[1])}" if m.sort_attr else "")
        if not got:
            return GSI_MISSING, f"{here}; the index returns no entry for it"
        if len(got) > 1:
            return GSI_EXTRA, f"{here}; the index returns {len(got)} entries for it"
        pv, sort, version = got[0]
        what = [f"{m.attr} {_show(pv)}"] if pv != mine[0] else []
        what += [f"{m.sort_attr} {_show(sort)}"] if m.sort_attr and sort != mine[1] else []
        what += [f"version {version or '-'} (the item's {mine[2] or '-'})"] if version != mine[2] else []
        return GSI_DIFFERS, f"{here}; its index entry has {', '.join(what)}"
    if not got:
        return None, ""
    state = "absent" if item is None else ("deleted (tombstone)" if is_tombstone(item) else "outside the index")
    return GSI_EXTRA, f"the table item is {state}; the index returns {len(got)} entr{'y' if len(got) == 1 else 'ies'}"
