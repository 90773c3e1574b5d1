"""Verify at scan cost: the compact record a scanned item leaves, and the rule the join
applies to one logical item's records (pure).

Verify no longer reads each moved item's counterpart while it scans. Every scanned
physical item leaves one :class:`Record` -- hashes of its key and of its logical item's
identity, which side it is (old copy, new copy at its own new key, misplaced new copy),
its version, tombstone flag, TTL epoch and a digest of its logical content -- and, once
every segment was scanned, the records are joined by identity (``reshard.jobs.records``).
Only the logical items whose records do not plainly agree (:func:`verdict`) are re-read
consistently and judged with :func:`reshard.core.compare.judge`, under the settle window,
exactly as before. So the join only has to be *conservative*: every logical item the
judge would call different on a quiet table must come out a suspect; a false suspect
costs one consistent re-read.

What the judge reads besides the item's own copies: any item of *another* identity at
one of the item's keys (a ``collision``), and an unmarked item at its new key. Two key
joins find those without reading: the item at the identity's new key (``nkey``), and
the items at its old candidate keys, through a *slot*: the old-layout key with the shard
set to 0 (a random-suffix layout; ``Template.parse`` refuses an ambiguous key, so the
slot of a key is that of the one item that may sit there) or the old key itself (a
calculated layout: one candidate). Any record at the identity's new key or in its slot
that is not its own makes it a suspect.
"""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from reshard.core.compare import expired
from reshard.core.layout import (TOMBSTONE_ATTR, VERSION_ATTR, KeyMapper, Layout, ignoring, is_tombstone, sets_in_order,
                                 text_of, to_av)
from reshard.core.migration import RESERVED_PREFIX, SHARD

#: Which physical item of a logical item a record is.
OLD, NEW, MISPLACED = 0, 1, 2


def _hash(text: bytes) -> bytes:
    # 16 bytes: two different keys, identities or contents share a hash with a
    # probability far below any hardware error's; the join compares nothing else.
    return hashlib.blake2b(text, digest_size=16).digest()


def _bytes_text(value):
    """JSON has no bytes: a B value (bytes at any depth) as hex text. Bytes only ever sit under a
    ``B`` or ``BS`` tag, where no str does, so this cannot make two different values alike."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    raise TypeError(f"not a wire value: {type(value).__name__}")


def _json_canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=_bytes_text).encode("utf-8", "surrogatepass")


try:  # the same bytes, several times faster (verify encodes every scanned item)
    import orjson

    def canonical(value) -> bytes:
        """Wire values as JSON with every map's names sorted (the same bytes as :func:`_json_canonical`)."""
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=_bytes_text)
        except TypeError:  # a str orjson refuses (a lone surrogate): the standard encoder's answer
            return _json_canonical(value)
except ImportError:  # pragma: no cover - orjson is optional
    canonical = _json_canonical


def content_bytes(content: Mapping[str, Any]) -> bytes:
    """:func:`canonical` of a content with its sets' members in one order (:func:`sets_in_order`).

    ``"SS":[``, ``"NS":[`` or ``"BS":[`` occur in canonical JSON only as a set's type tag (a
    map member's value is always an object, and a quote inside a string is escaped), so an
    item without sets is encoded once and not walked."""
    text = canonical(content)
    if b'S":[' in text:
        text = canonical(sets_in_order(content))
    return text


def digest(content: Mapping[str, Any] | None) -> bytes | None:
    """A digest of a logical item's content (wire format); None for a tombstone.

    Equal digests mean equal content as the judge compares it (``==`` on the wire dicts):
    the canonical JSON of wire values (every map's names sorted, at any depth; type tags
    kept, so ``{"S": "1"}`` and ``{"N": "1"}`` differ; lists and sets in their order)
    tells any two unequal values apart, and two equal ones give the same bytes whatever
    order their maps list their names in. Numbers are compared as DynamoDB returns them:
    it stores them normalised (``1.0`` and ``01`` read back as ``1``), so two copies of one
    number read back as the same text. A set digests the same whatever order a read lists
    its members in (:func:`content_bytes`), as the judge compares it (``KeyMapper.content``).
    """
    if content is None:
        return None
    return _hash(content_bytes(content))


def key_hash(key: Mapping[str, Any], attrs: Sequence[str]) -> bytes:
    """The hash of a physical key (its attributes in ``attrs`` order, with their types)."""
    return _hash(canonical([key[a] for a in attrs]))


def ident_hash(identity: tuple) -> bytes:
    """The hash of a logical item's identity (``KeyMapper.identity``)."""
    return _hash(repr(identity).encode())


def fields_text(values: Mapping[str, Any]) -> str:
    """The key fields of a logical item as text, types kept (to rebuild its keys for a re-read)."""
    out = []
    for f, v in values.items():
        if isinstance(v, bytes):
            out.append([f, "B", v.hex()])
        elif isinstance(v, (Decimal, int)) and not isinstance(v, bool):
            out.append([f, "N", str(v)])
        else:
            out.append([f, "S", v])
    text = canonical(out)
    try:
        return text.decode()
    except UnicodeDecodeError:  # a lone surrogate (no DynamoDB string has one): escaped, as JSON can
        return json.dumps(out, separators=(",", ":"))


def fields_from_text(text: str) -> dict[str, Any]:
    """The inverse of :func:`fields_text`."""
    return {f: bytes.fromhex(v) if t == "B" else Decimal(v) if t == "N" else v for f, t, v in json.loads(text)}


class Record(NamedTuple):
    """What the join knows of one scanned physical item.

    ``ident``/``nkey``/``cslot``/``fields`` describe its logical item (None when it is
    unmappable); ``kslot`` is the slot its own key occupies in the old layout (None if the
    key is no old-layout key). ``flag``: judge the logical item whatever the records say.
    """

    key: bytes
    ident: bytes | None
    side: int
    version: str = ""
    live: bool = True
    digest: bytes | None = None
    ttl: str | None = None
    nkey: bytes | None = None
    cslot: bytes | None = None
    kslot: bytes | None = None
    flag: bool = False
    fields: str = ""

    def row(self) -> tuple:
        return tuple(self)  # sqlite3 stores the two bools as 0/1


COLUMNS = ("key", "ident", "side", "version", "live", "digest", "ttl", "nkey", "cslot", "kslot", "flag", "fields")


def from_row(row: Sequence) -> Record:
    key, ident, side, version, live, dig, ttl, nkey, cslot, kslot, flag, fields = row
    return Record(key, ident, side, version, bool(live), dig, ttl, nkey, cslot, kslot, bool(flag), fields)


class Recorder:
    """Builds the records of one migration's scanned items (the scan half of verify).

    Verify's client CPU per scanned item is mostly here, so :meth:`record` inlines the
    helpers above (the same bytes: ``tests/unit/test_verify_cpu.py`` checks it against
    them on every item shape)."""

    def __init__(self, mapper: KeyMapper, ttl_attribute: str | None = None):
        self.mapper = mapper
        self.attrs = mapper.old.key_attrs
        self.ttl_attribute = ttl_attribute
        self._random = mapper.old.random
        self._key_attrs = set(self.attrs)
        self._kept = mapper._kept_key_attrs
        self._ignored = mapper.ignored
        # Per side: the template fields _content adds from the parsed values (not derived).
        self._added = {side: tuple(f for f in layout.template_fields if f not in layout.derived)
                       for side, layout in ((OLD, mapper.old), (NEW, mapper.new), (MISPLACED, mapper.new))}
        self._dropped = self._key_attrs - self._kept  # key attributes that are not content
        self._key_fields = mapper.key_fields
        old, new = mapper.old, mapper.new
        # A random old layout whose templates the new one keeps (only the shard count changes):
        # a copy's key parses the same under both, so the slot its key occupies is its own
        # item's slot whenever its shard is an old one (see :meth:`record`).
        self._same_templates = (self._random and SHARD in old.template_fields_all and old.derived == new.derived
                                and old.partition.parts == new.partition.parts
                                and (old.sort.parts if old.sort else None) == (new.sort.parts if new.sort else None))

    def slot(self, values: Mapping[str, Any]) -> bytes:
        """The slot of a logical item's old candidate keys."""
        old = self.mapper.old
        return key_hash(old.key(values, 0) if self._random else old.key(values), self.attrs)

    def key_slot(self, item: Mapping[str, Any], key: bytes) -> bytes | None:
        """The slot the physical key of ``item`` occupies in the old layout (None: none)."""
        if not self._random:
            return key
        old = self.mapper.old
        try:
            parsed = old.parse(item)
        except Exception:  # noqa: BLE001 - any key the old layout cannot parse is no old candidate
            return None
        parsed[SHARD] = 0
        out = {old.partition_attr: old.partition.format(parsed)}
        if old.sort is not None:
            out[old.sort_attr] = old.sort.format(parsed)
        return key_hash(out, self.attrs)

    def _content(self, item: Mapping[str, Any], layout: Layout, values: Mapping[str, Any]) -> bytes | None:
        """The digest of ``KeyMapper.content(item, layout)``, built from the fields the scan
        already parsed (the same values ``to_logical`` would parse from the key again)."""
        if is_tombstone(item):
            return None
        return self._digest(item, self._added[OLD if layout is self.mapper.old else NEW], values)

    def _digest(self, item: Mapping[str, Any], added: tuple, values: Mapping[str, Any]) -> bytes:
        dropped = self._dropped
        out = {k: v for k, v in item.items() if k not in dropped and not k.startswith(RESERVED_PREFIX)}
        if self._ignored:
            ignoring(out, self._ignored)
        for f in added:
            if f not in out and f in values:
                out[f] = to_av(values[f])
        return _hash(content_bytes(out))

    def _ttl(self, item: Mapping[str, Any]) -> str | None:
        av = item.get(self.ttl_attribute) if self.ttl_attribute else None
        return av.get("N") if isinstance(av, Mapping) else None

    def _identity(self, values: Mapping[str, Any]) -> bytes:
        """``ident_hash(mapper.identity(values))``, without the calls per field."""
        out = []
        for f in self._key_fields:
            v = values[f]
            out.append(v if type(v) is str or isinstance(v, bytes) else text_of(v, f))
        return _hash(repr(tuple(out)).encode())

    def record(self, item: Mapping[str, Any], side: int, values: Mapping[str, Any] | None,
               new_key: Mapping[str, Any] | None = None) -> Record:
        """The record of a scanned item: ``side`` and its key fields as the scan mapped them
        (``values`` None: unmappable), ``new_key`` its logical item's new-layout key."""
        attrs = self.attrs
        key = _hash(canonical([item[a] for a in attrs]))  # key_hash(item, attrs)
        v = item.get(VERSION_ATTR)
        version = v["S"] if v is not None and "S" in v else ""  # version_of (a non-string: the oldest)
        live = TOMBSTONE_ATTR not in item  # not is_tombstone
        if values is None:
            return Record(key, None, side, version, live, kslot=self.key_slot(item, key))
        m = self.mapper
        if side == NEW:
            nkey = key
        else:
            if new_key is None:
                new_key = m.new.key(values)
            nkey = _hash(canonical([new_key[a] for a in attrs]))
        dig = self._digest(item, self._added[side], values) if live else None
        flag = False
        if side == OLD and nkey == key and self._random and dig is not None:
            # A random layout's item that does not move serves both layouts and is judged as
            # both: if the two layouts read it differently, let the judge look.
            flag = dig != digest(m.content(item, m.new))
        if side == OLD:
            cslot = key if not self._random else self.slot(values)
            kslot = cslot
        else:
            cslot = self.slot(values)
            if self._same_templates:
                # ``key_slot`` without parsing the key again: the old templates are the new
                # ones, so the old parse of this key is the new parse ``values`` came from
                # (derived fields checked equal by ``KeyMapper.fields``), and formatting it
                # with shard 0 is ``slot(values)``; it is no old key when its shard is not.
                shard = m.new.parse(item)[SHARD]
                kslot = cslot if 0 <= shard < m.old.shards else None
            else:
                kslot = self.key_slot(item, key)
        ttl = None
        if self.ttl_attribute:
            av = item.get(self.ttl_attribute)
            ttl = av.get("N") if type(av) is dict or isinstance(av, Mapping) else None
        return Record(key, self._identity(values), side, version, live, dig, ttl, nkey, cslot, kslot, flag,
                      fields_text(values))


def verdict(records: Iterable[Record], *, ttl: bool, now: float) -> tuple[str | None, int]:
    """What one logical item's own records say, as :func:`reshard.core.compare.judge` would
    (before it re-reads): ``(kind, live old copies)``; kind None when they plainly agree.

    ``kind`` is the judge's kind where the records tell it (``missing``, ``stale``,
    ``diverged``, ``extra`` -- or ``new_only``, which the judge tells apart by reading --,
    ``resurrected``, ``collision``) and ``"flagged"`` for a record that asked for a look.
    Items of other identities at its keys are the key joins' business, not this rule's.
    """
    records = list(records)
    if any(r.flag for r in records):
        return "flagged", 0
    nkey = records[0].nkey
    is_expired = (lambda r: expired({"t": {"N": r.ttl}}, "t", now) if r.ttl is not None else False) if ttl \
        else (lambda r: False)
    olds = [r for r in records if r.side == OLD]
    present = [r for r in olds if not is_expired(r)]
    new = next((r for r in records if r.key == nkey and r.side != MISPLACED), None)
    if new is not None and is_expired(new):
        new = None
    live_olds = sum(1 for r in present if r.live)
    reference = None
    if present:
        top = max(r.version for r in present)
        tied = [r for r in present if r.version == top]
        if len({r.digest if r.live else None for r in tied}) > 1:
            return "collision", live_olds
        reference = tied[0]
    old_live = reference is not None and reference.live
    new_live = new is not None and new.live
    if not old_live and not new_live:
        return None, live_olds
    if old_live and not new_live:
        return "missing", live_olds
    if new_live and not old_live:
        return ("resurrected" if reference is not None else "extra"), live_olds
    if reference is new or reference.digest == new.digest:
        return None, live_olds
    return ("stale" if new.version < reference.version else "diverged"), live_olds
