"""Migration files: parse and validate the TOML migration file (the format is in the README).

Pure module (tomllib + stdlib only). Every mistake raises
:class:`~reshard.errors.MigrationFileError`, whose message is one line naming the
file, the key and the problem; the CLI turns it into exit status 2.

The result is an immutable :class:`Migration`; :mod:`reshard.core.layout` turns its
two :class:`LayoutSpec` into key functions, :mod:`reshard.core.index` turns each
:class:`IndexSpec` (an ``[index.NAME]`` table: a sharded GSI partition key rewritten in
place) into an :class:`~reshard.core.index.IndexMapper`.

A file changes the table's key layout (``[from]``/``[to]``), one or more GSI partition
keys (``[index.NAME]``), or both. An *index-only* file has no ``[from]``/``[to]``: items
keep their keys, ``Migration.source``/``target`` are None and ``changes_table`` is False.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib
import json
import os
import re
import string
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from reshard.errors import MigrationFileError

#: Jump consistent hash (Lamping & Veach 2014) over a 64-bit key from sha256; see
#: :func:`reshard.core.layout.jump_hash`. Growing N -> M moves only 1 - N/M of the items.
JUMP = "jump"

#: Hash functions a layout may name. Bit-exact with what applications compute:
#: ``int(hashlib.<name>(s.encode()).hexdigest(), 16) % shards`` for sha256 and md5;
#: ``jump_hash(int.from_bytes(hashlib.sha256(s.encode()).digest()[:8], "big"), shards)`` for jump.
HASHES = ("sha256", "md5", JUMP)

#: Upper bound on a layout's shard count. A random-suffix read needs one key per
#: shard in a single BatchGetItem (100 keys at most, one of which is the new key),
#: so random layouts are held to :data:`MAX_RANDOM_SHARDS`.
MAX_SHARDS = 1000
MAX_RANDOM_SHARDS = 99

#: The widest a ``{shard:...}`` format spec may pad (width or precision).
MAX_FORMAT_WIDTH = 32
#: Python's format-spec mini-language for an integer: [[fill]align][sign][z][#][0][width][grouping][.precision][type].
_SPEC_RE = re.compile(r"(?:(?P<fill>.)?(?P<align>[<>=^]))?(?P<sign>[-+ ])?z?#?0?(?P<width>\d+)?[_,]?"
                      r"(?:\.(?P<precision>\d+))?(?P<type>[bcdoxXn])?", re.S)

#: The field name a template uses for the shard number.
SHARD = "shard"

#: Reserved prefix of reshard's bookkeeping attributes (see reshard.core.layout).
RESERVED_PREFIX = "_rs_"

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
#: A field is named like any DynamoDB attribute (reserved words, '.', '#', '-', spaces,
#: non-ASCII: every expression reshard sends names it through ExpressionAttributeNames),
#: except for what the template syntax itself uses ({}, [] and ':'/'!' for specs) and
#: surrounding blanks (invisible in a template).
_FIELD_RE = re.compile(r"^(?!\s)[^{}\[\]:!]+(?<!\s)\Z")
_TOP_KEYS = {"id", "table", "description", "keys", "from", "to", "cleanup", "index"}
_INDEX_KEYS = {"partition", "sort", "type", "from", "to"}
_KEYS_KEYS = {"partition", "sort"}
_LAYOUT_KEYS = {"partition", "sort", "shards", "shard_by", "hash", "shard_function", "fields"}
#: An index layout has a partition template only: the GSI sort key is never rewritten.
_INDEX_LAYOUT_KEYS = _LAYOUT_KEYS - {"sort"}
#: DynamoDB's rule for table and index names.
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{3,255}$")
_CLEANUP_KEYS = {"ttl_attribute", "retain_hours"}
RANDOM_IN_TO = ('"random" is refused in [to] (the new layout must be deterministic: the shim and the backfill '
                "must write the same logical item to the same key)")
_DERIVED_KEYS = {"from", "format"}


@dataclass(frozen=True)
class DerivedField:
    """A field computed from another one, e.g. an hour bucket from an ISO timestamp."""

    name: str
    source: str
    format: str


@dataclass(frozen=True)
class TemplatePart:
    """One piece of a key template: literal text, or a ``{field}`` with an optional spec."""

    literal: str = ""
    field: str | None = None
    spec: str = ""


@dataclass(frozen=True)
class LayoutSpec:
    """One side (``[from]`` or ``[to]``) of a migration file, validated."""

    side: str
    partition: tuple[TemplatePart, ...]
    partition_text: str
    sort: tuple[TemplatePart, ...] | None
    sort_text: str | None
    shards: int
    shard_by: tuple[str, ...] | None  # None means "random"
    hash: str | None
    shard_function: str | None
    fields: Mapping[str, DerivedField] = field(default_factory=dict)
    #: Where a ``shard_function``'s module may be loaded from: the migration file's path
    #: (:func:`load_function`); not part of the layout's meaning.
    origin: str = field(default="", compare=False)

    @property
    def random(self) -> bool:
        """True when the shard cannot be computed from the item (random suffix)."""
        return self.shard_by is None

    def template_fields(self) -> list[str]:
        """Every field the key templates name, in order, without duplicates."""
        out: list[str] = []
        for parts in (self.partition, self.sort or ()):
            for p in parts:
                if p.field and p.field not in out:
                    out.append(p.field)
        return out


@dataclass(frozen=True)
class Keys:
    """The table's physical key attribute names."""

    partition: str
    sort: str | None


@dataclass(frozen=True)
class Cleanup:
    """The ``[cleanup]`` table: how old-layout items are retired."""

    ttl_attribute: str | None
    retain_hours: float


@dataclass(frozen=True)
class IndexSpec:
    """One ``[index.NAME]`` table: a GSI whose partition key attribute is sharded.

    ``partition`` is the GSI's partition key attribute, rewritten in place on every
    item (``[from]`` value -> ``[to]`` value); ``sort`` the GSI's sort key attribute, never
    rewritten. ``partition_type`` is the attribute's DynamoDB type ("S" or "N"); only a
    template that is exactly ``{shard}`` may be "N" (`start` checks it against the table).
    ``source``/``target`` carry a partition template only (``sort`` is None).
    """

    name: str
    partition: str
    sort: str | None
    partition_type: str
    source: LayoutSpec
    target: LayoutSpec


@dataclass(frozen=True)
class Migration:
    """A validated migration file.

    ``source``/``target`` are the table's ``[from]``/``[to]`` layouts, or None for an
    index-only file (``changes_table`` False: items keep their keys and only
    ``indexes`` move). Code that handles only table layouts asks :meth:`require_table`.
    """

    id: str
    table: str
    description: str
    keys: Keys
    source: LayoutSpec | None  # the [from] layout (None: the table's keys do not change)
    target: LayoutSpec | None  # the [to] layout
    cleanup: Cleanup
    text: str
    path: str
    indexes: tuple[IndexSpec, ...] = ()

    @property
    def changes_table(self) -> bool:
        """Whether the table's own keys change (False for an index-only migration)."""
        return self.source is not None

    def index(self, name: str) -> IndexSpec | None:
        """The ``[index.NAME]`` spec of GSI ``name``, or None."""
        return next((i for i in self.indexes if i.name == name), None)

    def require_table(self, what: str) -> None:
        """Refuse, in one line, ``what`` on a migration whose table keys do not change.

        The guard of every code path that knows only table layouts: an index-only file
        reaching it would otherwise fail deep inside with an AttributeError.
        """
        if self.source is None:
            names = ", ".join(i.name for i in self.indexes)
            raise MigrationFileError(self.path, None, f"{what} needs the table's [from]/[to] layouts; this file is "
                                                      f"index-only (it rewrites GSI {names} in place)")

    @property
    def content_hash(self) -> str:
        """sha256 of the file's bytes as text (kept beside :attr:`meaning_hash` on the control
        row: a shim or `start` of an earlier release compares this one)."""
        return hashlib.sha256(self.text.encode()).hexdigest()

    def meaning(self) -> dict:
        """What the file means, as plain data (:func:`meaning_of`)."""
        return meaning_of(self)

    @property
    def meaning_hash(self) -> str:
        """The hash of :meth:`meaning`: what identifies a migration file (PRODUCT.md), so a
        comment, whitespace, key order or quoting edit changes nothing and a change of meaning
        under the same id is refused by `start` and by shims. Prefixed with the form's version
        (:data:`MEANING_FORM`)."""
        return meaning_hash(meaning_of(self))


# ----------------------------------------------------------------------------- meaning
#
# A migration is identified by its meaning, not its bytes. The meaning is the parsed,
# validated file with every default filled in (an explicit ``hash = "sha256"`` equals an
# omitted one, ``shard_by = "x"`` equals ``["x"]``, ``retain_hours = 168`` an omitted
# ``[cleanup]``): the id, the table, its key names, both layouts of the table and of every
# ``[index.NAME]`` (templates as written, shard counts, shard_by in order -- the order is
# the hash input --, hash or shard_function, derived fields) and ``[cleanup]``. Not meaning:
# ``description``, comments, whitespace, key order, quoting, inline vs dotted tables, the
# order of ``[index.NAME]`` tables and of derived fields (both are looked up by name).

#: The version of the canonical form :func:`meaning_of` builds; bump it when the form changes
#: (a new key, another default), so a hash stored by another release is not compared with ours
#: (:func:`registered_changes` parses the registered text again instead).
MEANING_FORM = 1


def _layout_meaning(spec: LayoutSpec) -> dict:
    return {"partition": spec.partition_text, "sort": spec.sort_text, "shards": spec.shards,
            "shard_by": "random" if spec.random else list(spec.shard_by), "hash": spec.hash,
            "shard_function": spec.shard_function,
            "fields": {n: {"from": d.source, "format": d.format} for n, d in spec.fields.items()}}


def meaning_of(m: Migration) -> dict:
    """The canonical form of ``m``'s meaning (plain JSON data; see the comment above)."""
    return {"form": MEANING_FORM, "id": m.id, "table": m.table,
            "keys": {"partition": m.keys.partition, "sort": m.keys.sort},
            "from": _layout_meaning(m.source) if m.source else None,
            "to": _layout_meaning(m.target) if m.target else None,
            "index": {i.name: {"partition": i.partition, "sort": i.sort, "type": i.partition_type,
                               "from": _layout_meaning(i.source), "to": _layout_meaning(i.target)}
                      for i in m.indexes},
            "cleanup": {"ttl_attribute": m.cleanup.ttl_attribute, "retain_hours": float(m.cleanup.retain_hours)}}


def meaning_hash(meaning: dict) -> str:
    """``m<form>:<sha256 of the canonical JSON>`` (sorted keys, no spaces)."""
    canonical = json.dumps(meaning, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return f"m{meaning.get('form', MEANING_FORM)}:{hashlib.sha256(canonical.encode()).hexdigest()}"


def meaning_changes(old: dict, new: dict, prefix: str = "") -> list[str]:
    """What differs between two meanings, one ``key: old -> new`` each (``to.shards: 32 -> 64``)."""
    out: list[str] = []
    for k in sorted(set(old) | set(new), key=str):
        if k == "form":
            continue
        a, b = old.get(k), new.get(k)
        path = f"{prefix}{k}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += meaning_changes(a, b, f"{path}.")
        elif a != b:
            out.append(f"{path}: {_shown(a)} -> {_shown(b)}")
    return out


def _shown(v: Any) -> str:
    if v is None:
        return "(none)"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, ensure_ascii=False)
    return repr(v) if isinstance(v, str) else str(v)


@functools.lru_cache(maxsize=32)
def _registered_meaning(text: str) -> dict:
    """The meaning of a registered file's text (a shim asks at every refresh: parsed once)."""
    return meaning_of(parse(text, "<registered>"))


def registered_changes(m: Migration, text: str, file_hash: str = "", stored_meaning: str = "") -> list[str]:
    """How ``m`` differs in meaning from the file registered as ``text`` ([] when it means the same).

    ``file_hash`` / ``stored_meaning``: the hashes the control row holds (a row registered
    by an earlier release has no meaning hash). The same bytes, or the same meaning hash of
    this form, answer at once; otherwise the registered text is parsed and both meanings are
    compared here, which also names what changed.
    """
    if file_hash and file_hash == m.content_hash:
        return []
    if stored_meaning and stored_meaning == m.meaning_hash:
        return []
    try:
        registered = _registered_meaning(text)
    except MigrationFileError as e:
        return [f"the registered file is not valid for this release of reshard ({e.problem})"]
    return meaning_changes(registered, meaning_of(m))


def load(path: str | Path) -> Migration:
    """Read and validate a migration file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MigrationFileError(str(path), None, "no such file") from None
    except IsADirectoryError:
        raise MigrationFileError(str(path), None, "is a directory, not a migration file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise MigrationFileError(str(path), None, f"cannot read: {e}") from None
    return parse(text, str(path))


def parse(text: str, path: str = "<migration>", origin: str | None = None) -> Migration:
    """Validate the TOML text of a migration file; ``path`` is only used in messages.

    ``origin``: where the file was read from, for a ``shard_function``'s allow-list
    (default ``path``). A text read back from the control table (``origin`` given: the path
    ``start`` registered it from) was checked when it was registered: its function is
    checked again only where it is loaded (:func:`load_function`), so a host without the
    application's code can still read the migration."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise MigrationFileError(path, None, f"TOML syntax error: {e}") from None
    v = _Validator(path, origin)
    return v.migration(doc, text)


class _Validator:
    def __init__(self, path: str, origin: str | None = None):
        self.path = path
        self.origin = path if origin is None else origin
        self.check_functions = origin is None

    def fail(self, key: str | None, problem: str):
        raise MigrationFileError(self.path, key, problem)

    def table(self, doc: Any, key: str, allowed: set[str], required: set[str]) -> dict:
        if not isinstance(doc, dict):
            self.fail(key, f"must be a table ([{key}]), got {type(doc).__name__}")
        for k in doc:
            if k not in allowed:
                self.fail(f"{key}.{k}" if key else k, f"unknown key (allowed: {', '.join(sorted(allowed))})")
        for k in sorted(required):
            if k not in doc:
                self.fail(f"{key}.{k}" if key else k, "missing")
        return doc

    def string(self, value: Any, key: str, *, empty_ok: bool = False) -> str:
        if not isinstance(value, str):
            self.fail(key, f"must be a string, got {_describe(value)}")
        if not empty_ok and not value.strip():
            self.fail(key, "must not be empty")
        return value

    def migration(self, doc: dict, text: str) -> Migration:
        self.table(doc, "", _TOP_KEYS, {"id", "table", "keys"})
        mid = self.string(doc["id"], "id")
        if not _ID_RE.match(mid):
            self.fail("id", f"must be 1-100 characters of letters, digits, '.', '_' or '-' (got {mid!r})")
        table = self.string(doc["table"], "table")
        if not _NAME_RE.match(table):
            self.fail("table", f"not a valid DynamoDB table name: {table!r}")
        description = self.string(doc.get("description", ""), "description", empty_ok=True)

        kdoc = self.table(doc["keys"], "keys", _KEYS_KEYS, {"partition"})
        kp = self.string(kdoc["partition"], "keys.partition")
        ks = self.string(kdoc["sort"], "keys.sort") if "sort" in kdoc else None
        if ks == kp:
            self.fail("keys.sort", "must differ from keys.partition")
        keys = Keys(kp, ks)
        for k, name in (("keys.partition", kp), ("keys.sort", ks)):
            if name and name.startswith(RESERVED_PREFIX):
                self.fail(k, f"names starting with {RESERVED_PREFIX!r} are reserved for reshard's bookkeeping")

        for side, other in (("from", "to"), ("to", "from")):
            if side in doc and other not in doc:
                self.fail(other, f"missing: [{side}] needs [{other}] (a file without both keeps the table's "
                                 "keys and changes only [index.NAME] layouts)")
        source = target = None
        if "from" in doc:
            source = self.layout(doc["from"], "from", keys)
            target = self.layout(doc["to"], "to", keys)
            self.deterministic_and_different(source, target, "")
            self.suppliable(source, target, keys)
        indexes = self.indexes(doc.get("index", {}), keys, changes_table=source is not None)
        if source is None and not indexes:
            self.fail(None, "changes nothing: a migration file needs [from] and [to] (the table's layout), "
                            "[index.NAME] tables (a GSI's layout), or both")

        cdoc = self.table(doc.get("cleanup", {}), "cleanup", _CLEANUP_KEYS, set())
        ttl = self.string(cdoc["ttl_attribute"], "cleanup.ttl_attribute") if "ttl_attribute" in cdoc else None
        if ttl and ttl in (kp, ks):
            self.fail("cleanup.ttl_attribute", "must not be a key attribute")
        retain = cdoc.get("retain_hours", 168)
        if isinstance(retain, bool) or not isinstance(retain, (int, float)) or not 0 <= retain <= 24 * 366:
            self.fail("cleanup.retain_hours", f"must be a number of hours from 0 to 8784 (got {_describe(retain)})")
        return Migration(mid, table, description, keys, source, target, Cleanup(ttl, float(retain)), text, self.path,
                         indexes)

    def deterministic_and_different(self, source: LayoutSpec, target: LayoutSpec, where: str) -> None:
        if target.random:  # pragma: no cover - layout() refuses it first
            self.fail(f"{where}to.shard_by", RANDOM_IN_TO)
        if (source.partition_text, source.sort_text, source.shards, source.shard_by, source.hash,
                source.shard_function, dict(source.fields)) == (
                target.partition_text, target.sort_text, target.shards, target.shard_by, target.hash,
                target.shard_function, dict(target.fields)):
            self.fail(f"{where}to", "is identical to [from]: nothing would move")

    def indexes(self, doc: Any, keys: Keys, changes_table: bool) -> tuple[IndexSpec, ...]:
        """The ``[index.NAME]`` tables, each a GSI partition key's ``from``/``to`` layouts."""
        if not isinstance(doc, dict):
            self.fail("index", "must be a table of [index.NAME] tables, one per GSI")
        out: list[IndexSpec] = []
        for name, idoc in doc.items():
            where = f"index.{name}"
            if not _NAME_RE.match(name):
                self.fail(where, f"not a valid DynamoDB index name: {name!r}")
            self.table(idoc, where, _INDEX_KEYS, {"partition", "from", "to"})
            attr = self.string(idoc["partition"], f"{where}.partition")
            sort = self.string(idoc["sort"], f"{where}.sort") if "sort" in idoc else None
            for k, a in ((f"{where}.partition", attr), (f"{where}.sort", sort)):
                if a and a.startswith(RESERVED_PREFIX):
                    self.fail(k, f"names starting with {RESERVED_PREFIX!r} are reserved for reshard's bookkeeping")
            if attr in (keys.partition, keys.sort):
                self.fail(f"{where}.partition", f"{attr!r} is a key attribute of the table; the GSI partition "
                                                "attribute is rewritten in place, and an item's keys cannot be")
            if sort == attr:
                self.fail(f"{where}.sort", "must differ from the index's partition attribute")
            for prev in out:
                if prev.partition == attr:
                    self.fail(f"{where}.partition", f"{attr!r} is already the partition attribute of "
                                                    f"[index.{prev.name}]: one attribute has one layout")
            source = self.layout(idoc["from"], "from", None, where=f"{where}.from")
            target = self.layout(idoc["to"], "to", None, where=f"{where}.to")
            self.deterministic_and_different(source, target, f"{where}.")
            exact_shard = {"from": source.partition_text == "{" + SHARD + "}",
                           "to": target.partition_text == "{" + SHARD + "}"}
            ptype = idoc.get("type", "N" if all(exact_shard.values()) else "S")
            if ptype not in ("S", "N"):
                self.fail(f"{where}.type", f'must be "S" or "N" (the GSI partition attribute\'s type), got {_describe(ptype)}')
            if ptype == "N":
                for side, exact in exact_shard.items():
                    if not exact:
                        self.fail(f"{where}.{side}.partition", 'only a template that is exactly "{shard}" can '
                                                               'make a number; this one makes a string (type = "S")')
            for side, spec in (("from", source), ("to", target)):
                for f in (*spec.template_fields(), *(spec.shard_by or ()),
                          *(d.source for d in spec.fields.values())):
                    if f == attr:
                        self.fail(f"{where}.{side}", f"the layout uses {attr!r}, the attribute it rewrites")
                    if changes_table and f in (keys.partition, keys.sort):
                        # The table's keys differ between an item's old and new copies;
                        # the GSI value must be the same function of the logical item.
                        self.fail(f"{where}.{side}", f"field {f!r} is a key attribute of the table, whose "
                                                     "value changes in this migration; name an application field")
            out.append(IndexSpec(name, attr, sort, ptype, source, target))
        return tuple(out)

    def layout(self, doc: Any, side: str, keys: Keys | None, where: str | None = None) -> LayoutSpec:
        """One ``from``/``to`` layout; ``keys`` None for an index layout (``where`` names its table)."""
        where = where or side
        self.table(doc, where, _LAYOUT_KEYS if keys else _INDEX_LAYOUT_KEYS, {"partition", "shards"})
        ptext = self.string(doc["partition"], f"{where}.partition")
        partition = self.template(ptext, f"{where}.partition")
        if "sort" in doc:
            if keys.sort is None:
                self.fail(f"{where}.sort", "the table has no sort key ([keys] sort is not set)")
            stext = self.string(doc["sort"], f"{where}.sort")
            sort = self.template(stext, f"{where}.sort")
        else:
            stext, sort = None, None
        for k, parts in ((f"{where}.partition", partition), (f"{where}.sort", sort or ())):
            for p in parts:
                # A bare ``{PK}`` in the partition (``{SK}`` in the sort) keeps that key as is: a
                # field under its own name. Any other use of a key attribute's name is a mistake.
                own = keys and (keys.sort if k.endswith(".sort") else keys.partition)
                # An index layout reads stored attributes, the table's keys included.
                if keys and p.field is not None and p.field in (keys.partition, keys.sort) \
                        and not (len(parts) == 1 and p.field == own):
                    self.fail(k, f"field {{{p.field}}} is a physical key attribute name; "
                                 "templates name the application's fields")
                if p.field and p.field.startswith(RESERVED_PREFIX):
                    self.fail(k, f"field {{{p.field}}} uses the reserved prefix {RESERVED_PREFIX!r}")
        shard_uses = [p for p in (*partition, *(sort or ())) if p.field == SHARD]
        if not shard_uses:
            self.fail(f"{where}.partition", "must contain {shard} exactly once (in the partition or the sort template)")
        if len(shard_uses) > 1:
            # Blame the template holding the second {shard} (the sort's, when both have one).
            twice = f"{where}.sort" if any(p.field == SHARD for p in sort or ()) else f"{where}.partition"
            self.fail(twice, "{shard} may appear only once across the templates")

        shards = doc["shards"]
        if isinstance(shards, bool) or not isinstance(shards, int):
            self.fail(f"{where}.shards", f"must be an integer, got {_describe(shards)}")
        if not 1 <= shards <= MAX_SHARDS:
            self.fail(f"{where}.shards", f"must be an integer from 1 to {MAX_SHARDS} (got {shards})")

        fields = self.derived(doc.get("fields", {}), where)
        if SHARD in fields:
            self.fail(f"{where}.fields.{SHARD}", "'shard' is computed by the layout and cannot be derived")

        sb = doc.get("shard_by")
        hash_name = doc.get("hash")
        fn = doc.get("shard_function")
        if sb is None:
            self.fail(f"{where}.shard_by", 'missing: a list of fields to hash, or "random"')
        if sb == "random" and side == "to":
            # The first thing to say about a random [to]: whatever else it sets (a hash, more
            # than 99 shards) is moot, since [to] can never be random.
            self.fail(f"{where}.shard_by", RANDOM_IN_TO)
        if sb == "random":
            shard_by = None
            if shards > MAX_RANDOM_SHARDS:
                self.fail(f"{where}.shards", f"a random-suffix layout is limited to {MAX_RANDOM_SHARDS} shards "
                                            "(a read needs every shard's key in one BatchGetItem)")
            if hash_name is not None or fn is not None:
                self.fail(f"{where}.hash", 'has no meaning with shard_by = "random"')
        else:
            if isinstance(sb, str):
                sb = [sb]
            if not isinstance(sb, list) or not sb or not all(isinstance(x, str) and x for x in sb):
                self.fail(f"{where}.shard_by", f'must be a non-empty list of field names or "random" (got {_describe(sb)})')
            for f_ in sb:
                if not _FIELD_RE.match(f_):
                    self.fail(f"{where}.shard_by", f"{f_!r} is not a valid field name")
                if f_ == SHARD:
                    self.fail(f"{where}.shard_by", "cannot hash the shard number itself")
            shard_by = tuple(sb)
            if fn is not None:
                if hash_name is not None:
                    self.fail(f"{where}.shard_function", "set either hash or shard_function, not both")
                self.string(fn, f"{where}.shard_function")
                if not _FUNCTION_RE.match(fn):
                    self.fail(f"{where}.shard_function", f"must look like 'package.module:function' (got {fn!r})")
                # Checked, never imported here: parsing a file runs no code of it
                # (load_function imports the module where the function is first called).
                problem = function_refusal(fn, self.origin) if self.check_functions else None
                if problem:
                    self.fail(f"{where}.shard_function", problem)
            else:
                if hash_name is None:
                    hash_name = "sha256"
                if hash_name not in HASHES:
                    self.fail(f"{where}.hash", f"unknown hash {hash_name!r} (known: {', '.join(HASHES)})")
        return LayoutSpec(side, partition, ptext, sort, stext, shards, shard_by,
                          hash_name if shard_by is not None and fn is None else None,
                          fn if shard_by is not None else None, fields, origin=self.origin)

    def template(self, text: str, key: str) -> tuple[TemplatePart, ...]:
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError as e:
            self.fail(key, f"bad template {text!r}: {e}")
        parts: list[TemplatePart] = []
        for literal, fname, spec, conv in parsed:
            if literal:
                parts.append(TemplatePart(literal=literal))
            if fname is None:
                continue
            if fname == "":
                self.fail(key, f"empty field '{{}}' in template {text!r}")
            if conv:
                self.fail(key, f"conversions like '!{conv}' are not supported in templates")
            if not _FIELD_RE.match(fname):
                self.fail(key, f"{{{fname}}} is not a valid field name")
            if spec and fname != SHARD:
                self.fail(key, f"only {{shard}} may carry a format spec (got {{{fname}:{spec}}})")
            if spec:
                m = _SPEC_RE.fullmatch(spec)
                if m is None:
                    self.fail(key, f"bad format spec {{shard:{spec}}} (an integer format such as {{shard:02d}})")
                width, precision = (int(g) if g else 0 for g in m.group("width", "precision"))
                if width > MAX_FORMAT_WIDTH or precision > MAX_FORMAT_WIDTH:
                    # Python would pad every key formatted to that width (300 MB for 300000000).
                    self.fail(key, f"format spec {{shard:{spec}}}: width and precision are limited to "
                                   f"{MAX_FORMAT_WIDTH} (a key attribute holds at most 2048 bytes)")
                try:
                    format(7, spec)
                except ValueError:
                    self.fail(key, f"bad format spec {{shard:{spec}}}")
            if parts and parts[-1].field is not None:
                self.fail(key, f"fields {{{parts[-1].field}}} and {{{fname}}} touch: put a separator between "
                               "them, or the key cannot be parsed back")
            parts.append(TemplatePart(field=fname, spec=spec or ""))
        if not parts:
            self.fail(key, "template is empty")
        return tuple(parts)

    def derived(self, doc: Any, side: str) -> dict[str, DerivedField]:
        if not isinstance(doc, dict):
            self.fail(f"{side}.fields", "must be a table of derived fields")
        out = {}
        for name, spec in doc.items():
            key = f"{side}.fields.{name}"
            if not _FIELD_RE.match(name):
                self.fail(key, f"{name!r} is not a valid field name")
            self.table(spec, key, _DERIVED_KEYS, {"from", "format"})
            src = self.string(spec["from"], f"{key}.from")
            fmt = self.string(spec["format"], f"{key}.format")
            if src == name:
                self.fail(f"{key}.from", "a field cannot be derived from itself")
            if "%" not in fmt:
                self.fail(f"{key}.format", f"must be a strftime format such as '%Y-%m-%dT%H' (got {fmt!r})")
            out[name] = DerivedField(name, src, fmt)
        for name, d in out.items():
            if d.source in out:
                self.fail(f"{side}.fields.{name}.from", f"derives from another derived field ({d.source}); "
                                                      "derive from a stored or key field")
        return out

    def suppliable(self, source: LayoutSpec, target: LayoutSpec, keys: Keys) -> None:
        """Every field the [to] layout needs must be one items can supply.

        Items supply a field by storing it as an attribute or by carrying it in their
        old keys (which we parse with the [from] templates). Statically we know a field
        is stored when a [from] layout hashes it (shard_by) or when it is in a [from]
        template, so a [to] field outside those is almost always a typo.
        """
        known = set(source.template_fields()) | set(source.shard_by or ()) | set(source.fields)
        known.discard(SHARD)
        known |= {d.source for d in source.fields.values()}
        if keys.sort and (source.sort is None or target.sort is None):
            known.add(keys.sort)  # a sort key kept as is is a field under its own name
        for key, names in (("to.partition", [p.field for p in target.partition if p.field]),
                           ("to.sort", [p.field for p in target.sort or () if p.field]),
                           ("to.shard_by", list(target.shard_by or ()))):
            for n in names:
                if n == SHARD or n in known:
                    continue
                if n in target.fields:
                    src = target.fields[n].source
                    if src in known:
                        continue
                    self.fail(f"to.fields.{n}.from", f"field {src!r} is in no [from] template or shard_by, "
                                                     "so no item can supply it")
                self.fail(*self.unsupplied(source, target, key, n))

    @staticmethod
    def unsupplied(source: LayoutSpec, target: LayoutSpec, key: str, name: str) -> tuple[str, str]:
        """The key to blame, and the problem, for a [to] field ``name`` (at ``key``) no item supplies.

        The usual cause is one field spelt two ways: ``{sensr_id}`` in ``[from]`` and
        ``{sensor_id}`` in ``[to]``. The [to] name is the one nothing supplies, but the typo
        may be on either side. A [from] template field that [to] never uses and that is spelt
        almost like ``name`` is named too; the key blamed is the one whose spelling the file
        uses less often, and on a tie (one use each) the [from] key, with both spellings in the
        message: nothing in the file says which one is right.
        """
        plain = (f"field {{{name}}} is in no [from] template, shard_by or derived field, so no item can "
                 "supply it")
        used_by_to = {*target.template_fields(), *(target.shard_by or ()), *target.fields,
                      *(d.source for d in target.fields.values())}
        unused = [f for f in source.template_fields() if f != SHARD and f not in used_by_to]
        close = difflib.get_close_matches(name, unused, n=1, cutoff=0.75)
        if not close:
            return key, plain
        other = close[0]
        from_key = "from.partition" if any(p.field == other for p in source.partition) else "from.sort"

        def uses(f: str) -> int:
            return sum(p.field == f for spec in (source, target) for p in (*spec.partition, *(spec.sort or ()))) \
                + sum(list(spec.shard_by or ()).count(f) for spec in (source, target)) \
                + sum(d.source == f for spec in (source, target) for d in spec.fields.values())

        if uses(name) < uses(other):
            return key, f"{plain}; did you mean {{{other}}}, as {from_key} has it?"
        return from_key, (f"{{{other}}} here and {{{name}}} in {key} look like one field spelt two ways "
                          f"({{{name}}} is in no [from] template, shard_by or derived field, so no item can "
                          "supply it): correct the misspelt one")


# --------------------------------------------------------------------------- shard_function

#: ``package.module:function``.
_FUNCTION_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
#: Packages (comma-separated dotted prefixes) whose callables a ``shard_function`` may name,
#: wherever they are installed: the deployment says which, not the migration file.
FUNCTION_PACKAGES_ENV = "RESHARD_SHARD_FUNCTION_PACKAGES"
#: Never the application's own: the standard library and reshard itself (``shutil:rmtree``,
#: ``os:system`` would pass any signature check and run at the first key computed).
_NEVER = frozenset(sys.stdlib_module_names) | {"reshard", "builtins", "__main__"}


def _declared_packages() -> tuple[str, ...]:
    return tuple(p.strip() for p in os.environ.get(FUNCTION_PACKAGES_ENV, "").split(",") if p.strip())


def _declared(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in _declared_packages())


def _search_dirs(origin: str) -> list[Path]:
    """Where an application module next to a migration file lives: the file's directory and
    the one holding it (``app/migrations/x.toml``: ``app/``, the project). None for a file
    read from the control table (``control-table:<id>``): only declared packages then."""
    if not origin or origin.startswith(("control-table:", "<")):
        return []
    here = Path(origin).resolve().parent
    return [here, here.parent]


def _module_file(module: str, origin: str) -> Path | None:
    """The source of ``module`` under a search directory (a module or a package), else None.
    Only the filesystem is looked at: nothing is imported."""
    rel = Path(*module.split("."))
    for d in _search_dirs(origin):
        for candidate in (d / rel.with_suffix(".py"), d / rel / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def function_refusal(spec: str, origin: str) -> str | None:
    """Why ``spec`` (``package.module:function``) may not be a shard function, or None. Pure of
    imports: a module of the standard library or of reshard is refused; an application's module
    must be found next to the migration file (or in its project directory), or belong to a
    package the deployment declared in ``$RESHARD_SHARD_FUNCTION_PACKAGES``."""
    module = spec.partition(":")[0]
    top = module.split(".")[0]
    if top in _NEVER:
        return (f"{spec!r} names a module of the standard library or of reshard; a shard function must be the "
                "application's own (a module next to the migration file, or a package named in "
                f"${FUNCTION_PACKAGES_ENV})")
    if _declared(module) or _module_file(module, origin) is not None:
        return None
    where = " or ".join(str(d) for d in _search_dirs(origin)) or "(a file read from the control table: none)"
    return (f"module {module!r} is neither next to the migration file (looked in {where}) nor in a package named "
            f"in ${FUNCTION_PACKAGES_ENV} (comma-separated, e.g. 'myapp,company.sharding'); reshard imports only "
            "the application's own modules")


def load_function(spec: str, origin: str = "", path: str = "<migration>", key: str = "shard_function"):
    """Import ``package.module:function`` and return the callable (the escape hatch).

    Called where the function is first needed (a key computed), never when a file is
    parsed: importing the module runs its code. The same allow-list as
    :func:`function_refusal`; a module found next to the migration file is loaded from
    there (not from whatever ``sys.path`` holds under that name), and the callable must be
    defined in that module (``from shutil import rmtree`` in it is refused)."""
    problem = function_refusal(spec, origin)
    if problem:
        raise MigrationFileError(path, key, problem)
    mod_name, _, fn_name = spec.partition(":")
    try:
        mod = sys.modules.get(mod_name)
        if mod is None and not _declared(mod_name):
            mod = _import_from(mod_name, origin)
        if mod is None:
            mod = importlib.import_module(mod_name)
    except Exception as e:  # ImportError and whatever the module raises at import
        raise MigrationFileError(path, key, f"cannot import {mod_name!r}: {e}") from None
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise MigrationFileError(path, key, f"{mod_name!r} has no callable {fn_name!r}")
    if getattr(fn, "__module__", mod_name) != mod_name:
        raise MigrationFileError(path, key, f"{spec!r} is {getattr(fn, '__module__', '?')}.{fn_name}, imported into "
                                            f"{mod_name!r}: name the application's own function")
    return fn


def _import_from(module: str, origin: str):
    """Import ``module`` from the search directory that holds it (its top-level package
    loaded from that file, then the rest through the package's path)."""
    import importlib.util
    top, _, rest = module.partition(".")
    source = _module_file(top, origin)
    if source is None:
        return None
    package = source.name == "__init__.py"
    spec = importlib.util.spec_from_file_location(
        top, source, submodule_search_locations=[str(source.parent)] if package else None)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[top] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(top, None)
        raise
    return importlib.import_module(module) if rest else mod


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    return f"{type(value).__name__} {value!r}"
