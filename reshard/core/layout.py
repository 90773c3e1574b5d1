"""Key layouts: from logical fields to physical keys and back.

Pure domain module: no boto3, no I/O. Items here are in DynamoDB's *wire* format
(``{"attr": {"S": "x"}}``), because the backfill moves items it never needs to
deserialize whole; only the few fields a layout needs are turned into Python
scalars (``str``, ``Decimal``, ``bytes``) by :func:`scalar`.

Vocabulary
    *field*        a named value of the application's item (``sensor_id``, ``ts``).
    *layout*       how fields become the physical key attributes (one side of a migration).
    *logical item* what the application reads and writes: its fields, no physical keys.
    *physical item* what DynamoDB stores: the logical item plus key attributes and
                    reshard's bookkeeping attributes (prefix ``_rs_``).

A template that is a single ``{field}`` and nothing else is an *identity* template:
the attribute value passes through untouched, whatever its type (numbers and binary
sort keys keep their type). Any other template produces a string.
"""

from __future__ import annotations

import decimal
import hashlib
import random as _random
import re
from datetime import datetime, timezone
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Iterable, Mapping

from reshard.errors import UnmappableItem
from reshard.core.migration import JUMP, SHARD, LayoutSpec, Migration, RESERVED_PREFIX, TemplatePart, load_function
from reshard.core.marker import MARKER_ATTR

#: Bookkeeping attributes, all under the one reserved prefix, never shown to the app.
VERSION_ATTR = RESERVED_PREFIX + "v"  # write version, see reshard.core.versions
TOMBSTONE_ATTR = RESERVED_PREFIX + "del"  # present (BOOL true) on a delete marker
#: Marks a *new-layout copy*: an item reshard wrote at a new-layout key that differs
#: from the item's old-layout key. Its value is the migration id. Both layouts live in
#: the same table, and with templates like ``{sensor_id}#{shard}`` on both sides a
#: key alone cannot say which layout an item belongs to; the marker can. Items whose
#: key does not move are one physical item serving both layouts and carry no marker.
NEW_COPY_ATTR = RESERVED_PREFIX + "new"
#: On the backfill's copy of an *unversioned* (pre-migration) old item: that item's old
#: key (``dump_key``). It tells the backfill's idempotent redo of the same copy from a
#: copy of another unversioned old item of the same logical item (a collision).
SOURCE_ATTR = RESERVED_PREFIX + "src"
#: On an old-layout item cleanup retired (its TTL is set, it waits for DynamoDB to expire it):
#: the migration that retired it. Every reader and job treats such an item as absent: it is
#: a leftover, and a later migration must not copy it back (docs/late-writes.md, case 6).
GONE_ATTR = RESERVED_PREFIX + "gone"
#: What ``reshard cleanup --strip-bookkeeping`` removes from live items after ``complete``
#: (a tombstone's ``_rs_del`` is never stripped: that would turn a delete into an item).
BOOKKEEPING_ATTRS = (VERSION_ATTR, NEW_COPY_ATTR, SOURCE_ATTR)

#: DynamoDB's item size limit.
MAX_ITEM_BYTES = 400 * 1024

Wire = dict  # a DynamoDB attribute-value map, e.g. {"PK": {"S": "a#1"}}


# --------------------------------------------------------------------------- hashing

def hash_shard(value: str, shards: int, algorithm: str = "sha256") -> int:
    """The shard of ``value`` under ``algorithm``, bit-exact with what applications compute.

    ``sha256`` / ``md5``: ``int(hashlib.<algorithm>(value.encode()).hexdigest(), 16) % shards``
    (``int.from_bytes(digest)`` is the same integer without the hex round-trip).
    ``jump``: :func:`jump_hash` of :func:`jump_key`.
    """
    if algorithm == JUMP:
        return jump_hash(jump_key(value), shards)
    return _digest_int(algorithm, value) % shards


_last_digest: tuple = ("", None, 0)


def _digest_int(algorithm: str, value: str) -> int:
    # The last answer is kept: verify computes an item's shard under both layouts (and a new
    # copy's again for its old slot), in a row, and both rules often hash the same fields
    # with the same algorithm. One tuple, replaced whole: safe across threads.
    global _last_digest
    last = _last_digest
    if last[1] == value and last[0] == algorithm:
        return last[2]
    n = int.from_bytes(hashlib.new(algorithm, value.encode()).digest(), "big")
    _last_digest = (algorithm, value, n)
    return n


def jump_key(value: str) -> int:
    """The 64-bit key jump hashes: the first 8 bytes of ``sha256(value.encode())``, big-endian.

    Documented in the README so that an application can compute it itself:
    ``int.from_bytes(hashlib.sha256(s.encode()).digest()[:8], "big")``.
    """
    return _digest_int("sha256", value) >> 192  # the first 8 of sha256's 32 bytes


_U64 = (1 << 64) - 1


def jump_hash(key: int, buckets: int) -> int:
    """Jump consistent hash (Lamping & Veach 2014, arXiv:1406.2294), bit-exact with the paper's C++.

    ``key`` is an unsigned 64-bit integer. Growing ``buckets`` from N to M moves an item
    only into a bucket >= N, and only 1 - N/M of the items. The division is done in
    double precision exactly as the C++ does (Python floats are IEEE doubles), so the
    result matches other implementations bit for bit (test vectors in tests/unit).
    """
    if buckets < 1:
        raise ValueError("jump_hash needs at least one bucket")
    key &= _U64
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & _U64
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


# --------------------------------------------------------------------------- scalars

def scalar(av: Mapping[str, Any]) -> Any:
    """The Python value of a scalar attribute value (S, N, B); None for anything else."""
    if "S" in av:
        return av["S"]
    if "N" in av:
        return Decimal(av["N"])
    if "B" in av:
        return av["B"]
    return None


def to_av(value: Any) -> dict:
    """The attribute value of a Python scalar (str, int, Decimal, bytes)."""
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, bool):
        raise TypeError("booleans cannot be key values")
    if isinstance(value, Decimal):
        return {"N": number_text(value)}
    if isinstance(value, int):
        return {"N": str(value)}
    if isinstance(value, (bytes, bytearray)):
        return {"B": bytes(value)}
    raise TypeError(f"{type(value).__name__} cannot be a key value")


def number_text(value: Decimal) -> str:
    """A number as DynamoDB stores it: no exponent, no trailing zeros (``1.50`` -> ``1.5``,
    ``1E+2`` -> ``100``, ``-0`` -> ``0``). ``Decimal("1.50")`` and ``Decimal("1.5")`` are one
    DynamoDB number, so they must make one key and one shard."""
    if not value.is_finite():
        return str(value)  # refused by DynamoDB; not ours to reformat
    if value == 0:
        return "0"
    digits = len(value.as_tuple().digits)
    # A precision of the value's own digit count: normalize() never rounds it.
    return format(value.normalize(decimal.Context(prec=max(digits, 1))), "f")


def text_of(value: Any, field: str) -> str:
    """How a field's value is written inside a string template (and before hashing)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        raise UnmappableItem("bad-field-type", f"field {field!r} is a boolean; keys need a string or number")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Decimal):
        # DynamoDB's text of the number (1.50 -> "1.5", 1.2E+5 -> "120000"): 1.50 and 1.5 are
        # one DynamoDB number, so one item, one key, one shard -- as the jobs compute it from
        # the stored (normalised) attribute.
        return number_text(value)
    raise UnmappableItem("bad-field-type", f"field {field!r} is {type(value).__name__}; "
                                           "a string template needs a string or number")


# --------------------------------------------------------------------------- templates

class Template:
    """A compiled key template such as ``{sensor_id}#{shard}`` or ``{shard:02d}#{bucket}``."""

    def __init__(self, parts: tuple[TemplatePart, ...], text: str):
        self.parts = parts
        self.text = text
        self.fields = [p.field for p in parts if p.field]
        self.identity = len(parts) == 1 and parts[0].field is not None and not parts[0].spec
        # Two regexes: every field lazy, and every field greedy. The lazy match is the
        # split with the shortest first field (then second, ...), the greedy one the
        # split with the longest; when they agree, the split is the only one. When they
        # differ (``{kind}#{name}`` over "a#b#c"), the key is ambiguous: a value held the
        # separator, and the round-trip check alone cannot see it, because every split
        # formats back to the same text.
        self._regex = self._compile(parts, lazy=True)
        self._greedy = self._compile(parts, lazy=False)
        self._free_fields = len(set(self.fields))
        # Group names computed once (a regex substitution per field per parse was most of
        # the parse's cost; verify parses every scanned key).
        self._groups = tuple((name, _group(name)) for name in dict.fromkeys(self.fields))
        self._plan = tuple((p.literal, p.field, p.spec) for p in parts)
        # The same template as a str.format pattern, positional (field names may be anything).
        self._arg_names = tuple(p.field for p in parts if p.field is not None)
        braces = any("{" in p.spec or "}" in p.spec for p in parts)
        self._fmt = None if self.identity or braces else "".join(
            p.literal.replace("{", "{{").replace("}", "}}") if p.field is None
            else "{" + (":" + p.spec if p.spec else "") + "}" for p in parts)
        # The last parse is kept: a scan meets a partition's items one after another (one
        # tuple, replaced whole: safe across threads; a refusal raises, it is not kept).
        self._last: tuple = (None, ())

    @staticmethod
    def _compile(parts: tuple[TemplatePart, ...], lazy: bool) -> re.Pattern:
        q = "?" if lazy else ""
        pattern, seen = [], set()
        for p in parts:
            if p.field is None:
                pattern.append(re.escape(p.literal))
            elif p.field in seen:
                pattern.append(f"(?P={_group(p.field)})")
            else:
                seen.add(p.field)
                body = (r"-?\d+" if p.field == SHARD else ".*") + q
                pattern.append(f"(?P<{_group(p.field)}>{body})")
        # \Z, not $: "$" also matches before a trailing newline, which a key value may end with.
        return re.compile("^" + "".join(pattern) + r"\Z", re.DOTALL)

    def format(self, values: Mapping[str, Any]) -> dict:
        """The attribute value for these field values (identity templates keep the type)."""
        if self.identity:
            name = self.parts[0].field
            if name not in values:
                raise UnmappableItem("missing-field", f"needs field {name!r}")
            v = values[name]
            return v if isinstance(v, dict) else to_av(v)
        if self._fmt is not None:
            # Fast path: str and int values format exactly as below (text_of of a str is the
            # str, of an int str(int); a spec is format(v, spec)); anything else (Decimal,
            # bool, a wire value, a missing field) takes the loop and its checks.
            try:
                args = [values[n] for n in self._arg_names]
            except KeyError:
                args = None
            if args is not None:
                for a in args:
                    if type(a) is not str and type(a) is not int:
                        break
                else:
                    return {"S": self._fmt.format(*args)}
        out = []
        for literal, name, spec in self._plan:
            if name is None:
                out.append(literal)
                continue
            if name not in values:
                raise UnmappableItem("missing-field", f"needs field {name!r}")
            v = values[name]
            if type(v) is str and not spec:  # text_of's answer for a str, without the call
                out.append(v)
                continue
            if isinstance(v, dict):
                v = scalar(v)
            out.append(format(v, spec) if spec else text_of(v, name))
        return {"S": "".join(out)}

    def parse(self, av: Mapping[str, Any]) -> dict[str, Any]:
        """Recover the field values from an attribute value; raises UnmappableItem.

        A key with more than one split (a field value containing the separator next to
        another free field) is refused as ambiguous, and the result is checked by
        formatting it again: a key that does not round-trip (a zero-padded shard the
        template does not pad) is refused rather than guessed.
        """
        if self.identity:
            return {self.parts[0].field: scalar(av)}
        if "S" not in av:
            raise UnmappableItem("unparseable-key", f"expected a string for template {self.text!r}")
        s = av["S"]
        last = self._last
        if last[0] != s:
            last = self._last = (s, self._parse_text(s))
        return dict(last[1])

    def _parse_text(self, s: str) -> tuple:
        m = self._regex.match(s)
        if not m:
            raise UnmappableItem("unparseable-key", f"{s!r} does not match template {self.text!r}")
        if self._free_fields > 1 and self._greedy.match(s).groups() != m.groups():
            raise UnmappableItem("unparseable-key", f"{s!r} is ambiguous under template {self.text!r}: "
                                                    "a field value contains the separator")
        values: dict[str, Any] = {}
        for name, group in self._groups:
            raw = m.group(group)
            values[name] = int(raw) if name == SHARD else raw
        if self.format(values)["S"] != s:
            raise UnmappableItem("unparseable-key", f"{s!r} does not round-trip through template {self.text!r}")
        return tuple(values.items())


def _group(field: str) -> str:
    # Regex group names must be identifiers; field names may hold any character. Every
    # non-alphanumeric one (the '_' too) is escaped, so two fields never share a group.
    return "f_" + re.sub(r"[^A-Za-z0-9]", lambda m: f"_{ord(m.group()):x}_", field)


# --------------------------------------------------------------------------- derived fields

def derive_time(value: Any, fmt: str, field: str) -> str:
    """Format a timestamp field (ISO 8601 text, or epoch seconds as a number) with strftime."""
    if isinstance(value, dict):
        value = scalar(value)
    try:
        if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
            dt = datetime.fromtimestamp(float(value), tz=timezone.utc)
        elif isinstance(value, str):
            dt = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=timezone.utc)
            dt = dt.astimezone(timezone.utc)
        else:
            raise ValueError(type(value).__name__)
    except (ValueError, OverflowError, InvalidOperation, OSError) as e:
        raise UnmappableItem("bad-timestamp", f"field {field!r} = {value!r} is not an ISO 8601 time "
                                              f"or epoch seconds ({e})") from None
    return dt.strftime(fmt)


# --------------------------------------------------------------------------- layouts

class _LazyFunction:
    """A layout's ``shard_function``, imported at its first call (never when a file is parsed
    or a layout built: importing runs the module's code; :func:`load_function`)."""

    def __init__(self, spec: LayoutSpec):
        self.spec = spec
        self._fn: Callable[[str, int], int] | None = None

    def __call__(self, key: str, shards: int) -> int:
        if self._fn is None:
            self._fn = load_function(self.spec.shard_function, self.spec.origin, self.spec.origin or "<migration>",
                                     f"{self.spec.side}.shard_function")
        return self._fn(key, shards)


class Layout:
    """One side of a migration, compiled: computes and parses physical keys."""

    def __init__(self, spec: LayoutSpec, partition_attr: str, sort_attr: str | None):
        self.spec = spec
        self.side = spec.side
        self.shards = spec.shards
        self.random = spec.random
        self.partition_attr = partition_attr
        self.sort_attr = sort_attr
        self.partition = Template(spec.partition, spec.partition_text)
        if sort_attr is None:
            self.sort = None
        elif spec.sort is None:
            # No sort template: the sort key value is kept as it is, under its own name.
            self.sort = Template((TemplatePart(field=sort_attr),), "{" + sort_attr + "}")
        else:
            self.sort = Template(spec.sort, spec.sort_text)
        self.derived = dict(spec.fields)
        self.shard_by = spec.shard_by
        if spec.shard_function:
            self._shard_fn: Callable[[str, int], int] = _LazyFunction(spec)
        else:
            algorithm = spec.hash or "sha256"
            self._shard_fn = lambda s, n: hash_shard(s, n, algorithm)
        templ = [*self.partition.fields, *(self.sort.fields if self.sort else [])]
        self.template_fields = list(dict.fromkeys(f for f in templ if f != SHARD))
        self.template_fields_all = set(templ)
        # The fields an item must supply (stored or parsed) to compute this layout's key.
        needed: list[str] = []
        for f in self.template_fields:
            if f in self.derived:
                needed.append(self.derived[f].source)
            else:
                needed.append(f)
        needed.extend(self.shard_by or ())
        self.needed_fields = list(dict.fromkeys(needed))
        self.key_attrs = [partition_attr] + ([sort_attr] if sort_attr else [])

    # -- computing keys
    def shard_for(self, values: Mapping[str, Any]) -> int:
        """The shard of an item with these field values (not for random layouts)."""
        if self.random:
            raise ValueError("a random-suffix layout has no computed shard")
        parts = []
        for f in self.shard_by:
            if f not in values:
                raise UnmappableItem("missing-field", f"needs field {f!r} to compute the shard")
            v = values[f]
            parts.append(v if type(v) is str else text_of(v if not isinstance(v, dict) else scalar(v), f))
        shard = self._shard_fn("#".join(parts), self.shards)
        if not isinstance(shard, int) or not 0 <= shard < self.shards:
            raise UnmappableItem("bad-shard", f"shard function returned {shard!r}, not 0..{self.shards - 1}")
        return shard

    def with_derived(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` plus this layout's derived fields."""
        out = dict(values)
        for name, d in self.derived.items():
            if d.source not in out:
                raise UnmappableItem("missing-field", f"needs field {d.source!r} to derive {name!r}")
            out[name] = derive_time(out[d.source], d.format, d.source)
        return out

    def key(self, values: Mapping[str, Any], shard: int | None = None) -> Wire:
        """The physical key (wire format) for these field values.

        ``shard`` is required for a random layout (the caller picks it) and ignored
        otherwise, where it is computed from ``shard_by``.
        """
        if not self.random:
            shard = self.shard_for(values)
        elif shard is None:
            raise ValueError("a random-suffix layout needs the shard chosen by the caller")
        full = self.with_derived(values)
        full[SHARD] = shard
        key = {self.partition_attr: self.partition.format(full)}
        if self.sort is not None:
            key[self.sort_attr] = self.sort.format(full)
        return key

    def candidate_keys(self, values: Mapping[str, Any]) -> list[Wire]:
        """Every physical key the item may have: one per shard if random, else one."""
        if not self.random:
            return [self.key(values)]
        return [self.key(values, s) for s in range(self.shards)]

    def random_shard(self, rng: _random.Random | None = None) -> int:
        """A shard for a brand-new item of a random layout."""
        return (rng or _random).randrange(self.shards)

    # -- parsing keys
    def parse(self, item: Mapping[str, Any]) -> dict[str, Any]:
        """The field values (and ``shard``) carried by an item's physical key attributes."""
        if self.partition_attr not in item:
            raise UnmappableItem("unparseable-key", f"item has no {self.partition_attr!r} attribute")
        values = self.partition.parse(item[self.partition_attr])
        if self.sort is not None:
            if self.sort_attr not in item:
                raise UnmappableItem("unparseable-key", f"item has no {self.sort_attr!r} attribute")
            for k, v in self.sort.parse(item[self.sort_attr]).items():
                if k in values and values[k] != v:
                    raise UnmappableItem("unparseable-key", f"field {k!r} differs between partition and sort key")
                values[k] = v
        shard = values.get(SHARD)
        if shard is None and self.shards == 1 and SHARD not in self.template_fields_all:
            shard = values[SHARD] = 0  # a one-shard layout without {shard} (an index-only migration's table)
        if shard is None or not 0 <= shard < self.shards:
            raise UnmappableItem("bad-shard", f"shard {shard!r} is outside 0..{self.shards - 1}")
        return values


class KeyMapper:
    """Both layouts of a migration, and the item conversions between them.

    ``old`` is the ``[from]`` layout, ``new`` the ``[to]`` layout.
    """

    def __init__(self, migration: Migration):
        migration.require_table("re-keying the table")  # index-only files: reshard.core.index
        self.migration = migration
        k = migration.keys
        self.keys = k
        self.old = Layout(migration.source, k.partition, k.sort)
        self.new = Layout(migration.target, k.partition, k.sort)
        # Identity of a logical item: every field either layout needs for its key.
        self.key_fields = tuple(dict.fromkeys([*self.old.needed_fields, *self.new.needed_fields]))
        self._key_attrs = set(self.old.key_attrs)
        # A field that is also a key attribute name (identity sort template) stays in the item.
        self._kept_key_attrs = {a for a in self._key_attrs
                                if a in self.old.template_fields or a in self.new.template_fields}
        #: Attributes that are not content: a combined migration's sharded GSI attributes, whose
        #: value legitimately differs between an item's old and new copies while it runs (the
        #: index verify checks them against the [to] layout instead).
        self.ignored = frozenset(i.partition for i in migration.indexes)

    def layout(self, side: str) -> Layout:
        return self.old if side == "old" else self.new

    # -- fields
    def fields(self, item: Mapping[str, Any], layout: Layout) -> dict[str, Any]:
        """Every key field of a physical item in ``layout``: parsed from its keys, else stored.

        Raises UnmappableItem when a field is missing, a key does not parse, or a
        computed shard disagrees with the one in the key (the item was not written
        by this layout's rule and the shim could never find it).
        """
        parsed = layout.parse(item)
        shard = parsed.pop(SHARD)
        values: dict[str, Any] = {}
        for f in self.key_fields:
            if f in parsed and f not in layout.derived:
                values[f] = parsed[f]
            elif f in item and (f not in self._key_attrs or f in self._kept_key_attrs):
                values[f] = scalar(item[f])
                if values[f] is None:
                    raise UnmappableItem("bad-field-type", f"field {f!r} is not a string, number or binary")
            else:
                raise UnmappableItem("missing-field", f"field {f!r} is neither stored nor in the "
                                                      f"{layout.side} keys")
        # Derived fields found in the key must agree with their source.
        for name, d in layout.derived.items():
            if name in parsed and d.source in values:
                if derive_time(values[d.source], d.format, d.source) != parsed[name]:
                    raise UnmappableItem("unparseable-key", f"{name!r} in the key does not match {d.source!r}")
        if not layout.random and layout.shard_for(values) != shard:
            raise UnmappableItem("shard-mismatch", f"key says shard {shard} but the {layout.side} rule "
                                                   f"computes {layout.shard_for(values)}")
        return values

    def logical_fields(self, item: Mapping[str, Any]) -> dict[str, Any]:
        """Key fields of a *logical* item (or key) the application passed in."""
        values = {}
        for f in self.key_fields:
            if f not in item:
                raise UnmappableItem("missing-field", f"the item or Key lacks field {f!r} "
                                                      f"(needed: {', '.join(self.key_fields)})")
            v = item[f]
            values[f] = scalar(v) if isinstance(v, dict) else v
        return values

    def identity(self, values: Mapping[str, Any]) -> tuple:
        """A hashable identity of a logical item, for dedupe and bookkeeping."""
        return tuple(text_of(values[f], f) if not isinstance(values[f], bytes) else values[f]
                     for f in self.key_fields)

    # -- conversions
    def to_physical(self, logical: Mapping[str, Any], layout: Layout, shard: int | None = None) -> Wire:
        """Physical item (wire) in ``layout`` for a logical wire item."""
        key = layout.key(self.logical_fields(logical), shard)
        item = dict(logical)
        item.update(key)
        return item

    def to_logical(self, physical: Mapping[str, Any], layout: Layout) -> Wire:
        """Logical wire item of a physical item: keys and bookkeeping stripped, parsed fields restored."""
        out = {k: v for k, v in physical.items()
               if not k.startswith(RESERVED_PREFIX) and (k not in self._key_attrs or k in self._kept_key_attrs)}
        missing = [f for f in layout.template_fields if f not in out and f not in layout.derived]
        if missing:
            parsed = layout.parse(physical)
            for f in missing:
                if f in parsed:
                    out[f] = to_av(parsed[f])
        return out

    def content(self, physical: Mapping[str, Any], layout: Layout) -> Wire:
        """What verify and the copy compare between copies: :meth:`to_logical` with the
        value of each :attr:`ignored` attribute (a combined migration's GSI attributes)
        replaced by a marker: whether a copy carries it still counts (a copy left out of a
        sparse index is a difference), its value does not. Sets' members in one order
        (:func:`sets_in_order`): a set is the same value however a read lists it."""
        return sets_in_order(ignoring(self.to_logical(physical, layout), self.ignored))

    def remap(self, old_item: Mapping[str, Any]) -> tuple[Wire, bool]:
        """The new-layout physical item for an old-layout physical item, and whether it moves.

        Everything but the key attributes is carried over byte for byte (bookkeeping
        too: the version fences later writes). A field the old keys carried but the
        new keys do not is stored as an attribute, so nothing the item knew is lost.
        Raises UnmappableItem, including when the result exceeds 400 KB.
        """
        values = self.fields(old_item, self.old)
        new_key = self.new.key(values)
        moved = any(old_item.get(a) != v for a, v in new_key.items())
        if not moved:
            return dict(old_item), False
        item = {k: v for k, v in old_item.items() if k not in self._key_attrs or k in self._kept_key_attrs}
        for f in self.old.template_fields:
            if f in values and f not in item and f not in self.new.template_fields and f not in self.old.derived:
                item[f] = to_av(values[f])
        item.update(new_key)
        item[NEW_COPY_ATTR] = {"S": self.migration.id}
        size = item_size(item)
        if size > MAX_ITEM_BYTES:
            raise UnmappableItem("too-large", f"{size} bytes after re-keying (limit {MAX_ITEM_BYTES})")
        return item, True

    def is_new_copy(self, item: Mapping[str, Any]) -> bool:
        """True for an item that exists only as this migration's new-layout copy."""
        marker = item.get(NEW_COPY_ATTR)
        return marker is not None and marker.get("S") == self.migration.id

    def moves(self, old_item: Mapping[str, Any]) -> bool:
        """Whether an old-layout item's physical key changes in the new layout."""
        values = self.fields(old_item, self.old)
        return any(old_item.get(a) != v for a, v in self.new.key(values).items())


#: What :meth:`KeyMapper.content` puts in place of an ignored attribute's value.
PRESENT = {"NULL": True}


def _number_order(text: str):
    try:
        return (0, Decimal(text), text)
    except (InvalidOperation, TypeError):
        return (1, 0, str(text))


def _set_members_ordered(av):
    """One wire value with every set's members in one order, at any depth: DynamoDB's sets
    are unordered, so two reads of one set may list its members differently (NS by value)."""
    if not isinstance(av, dict) or len(av) != 1:
        return av
    (tag, value), = av.items()
    if tag in ("SS", "BS") and isinstance(value, list):
        return {tag: sorted(value)}
    if tag == "NS" and isinstance(value, list):
        return {tag: sorted(value, key=_number_order)}
    if tag == "M" and isinstance(value, dict):
        return {"M": {k: _set_members_ordered(v) for k, v in value.items()}}
    if tag == "L" and isinstance(value, list):
        return {"L": [_set_members_ordered(v) for v in value]}
    return av


def sets_in_order(content: Mapping[str, Any]) -> dict:
    """``content`` (attribute name -> wire value) with every set's members in one order, so
    that two copies of one item compare and digest equal whatever order each read listed a
    set in (a list keeps its order: it is part of the value)."""
    return {k: _set_members_ordered(v) for k, v in content.items()}


def ignoring(content: dict, ignored: Iterable[str]) -> dict:
    """``content`` with each ``ignored`` attribute it has replaced by :data:`PRESENT`."""
    for a in ignored:
        if a in content:
            content[a] = PRESENT
    return content


def strip_action(item: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
    """What the strip pass does to one item: ``("delete", ())`` for a tombstone (a leftover
    delete marker: removing it keeps the item absent), ``("strip", attrs)`` for a live
    item carrying bookkeeping, ``("clean", ())`` otherwise."""
    if is_tombstone(item):
        return "delete", ()
    present = tuple(a for a in BOOKKEEPING_ATTRS if a in item)
    return ("strip", present) if present else ("clean", ())


def is_tombstone(item: Mapping[str, Any] | None) -> bool:
    """True for a delete marker left by the shim."""
    return bool(item) and TOMBSTONE_ATTR in item


def is_retired(item: Mapping[str, Any] | None) -> bool:
    """True for an old-layout item a cleanup retired (``_rs_gone``): absent for every reader."""
    return bool(item) and GONE_ATTR in item


def not_data(item: Mapping[str, Any] | None) -> bool:
    """An item no job copies, compares or counts: the table marker (``core/marker.py``) or a
    retired leftover (:func:`is_retired`). Neither is unmappable nor missing: it is not data."""
    return bool(item) and (GONE_ATTR in item or MARKER_ATTR in item)


def key_of(item: Mapping[str, Any], attrs: Iterable[str]) -> Wire:
    return {a: item[a] for a in attrs}


def item_size(item: Mapping[str, Any]) -> int:
    """DynamoDB's size of a wire item in bytes (names plus values), as documented."""
    return sum(len(k.encode()) + _av_size(v) for k, v in item.items())


def _av_size(av: Mapping[str, Any]) -> int:
    (t, v), = av.items()
    if t == "S":
        return len(v.encode())
    if t == "N":
        digits = len(v.lstrip("-").replace(".", "").lstrip("0")) or 1
        return (digits + 1) // 2 + 1
    if t == "B":
        return len(v)
    if t in ("BOOL", "NULL"):
        return 1
    if t == "SS":
        return sum(len(x.encode()) for x in v)
    if t == "NS":
        return sum(_av_size({"N": x}) for x in v)
    if t == "BS":
        return sum(len(x) for x in v)
    if t == "L":
        return 3 + sum(_av_size(x) + 1 for x in v)
    if t == "M":
        return 3 + sum(len(k.encode()) + _av_size(x) + 1 for k, x in v.items())
    return 0
