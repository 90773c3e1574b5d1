"""Migration files: parse and validate the TOML migration file (the format is in the README).

Pure module (tomllib + stdlib only). Every mistake raises
:class:`~reshard.errors.MigrationFileError`, whose message is one line naming the
file, the key and the problem; the CLI turns it into exit status 2.

The result is an immutable :class:`Migration`; :mod:`reshard.core.layout` turns its
two :class:`LayoutSpec` into key functions.
"""

from __future__ import annotations

import hashlib
import importlib
import re
import string
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
_TOP_KEYS = {"id", "table", "description", "keys", "from", "to", "cleanup"}
_KEYS_KEYS = {"partition", "sort"}
_LAYOUT_KEYS = {"partition", "sort", "shards", "shard_by", "hash", "shard_function", "fields"}
_CLEANUP_KEYS = {"ttl_attribute", "retain_hours"}
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
class Migration:
    """A validated migration file."""

    id: str
    table: str
    description: str
    keys: Keys
    source: LayoutSpec  # the [from] layout
    target: LayoutSpec  # the [to] layout
    cleanup: Cleanup
    text: str
    path: str

    @property
    def content_hash(self) -> str:
        """sha256 of the file's text: `start` refuses a changed file under the same id."""
        return hashlib.sha256(self.text.encode()).hexdigest()


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


def parse(text: str, path: str = "<migration>") -> Migration:
    """Validate the TOML text of a migration file; ``path`` is only used in messages."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise MigrationFileError(path, None, f"TOML syntax error: {e}") from None
    v = _Validator(path)
    return v.migration(doc, text)


class _Validator:
    def __init__(self, path: str):
        self.path = path

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
        self.table(doc, "", _TOP_KEYS, {"id", "table", "keys", "from", "to"})
        mid = self.string(doc["id"], "id")
        if not _ID_RE.match(mid):
            self.fail("id", f"must be 1-100 characters of letters, digits, '.', '_' or '-' (got {mid!r})")
        table = self.string(doc["table"], "table")
        if not re.match(r"^[A-Za-z0-9_.-]{3,255}$", table):
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

        source = self.layout(doc["from"], "from", keys)
        target = self.layout(doc["to"], "to", keys)
        if target.random:
            self.fail("to.shard_by", '"random" is refused in [to]: the new layout must be deterministic, '
                      "so the shim and the backfill write the same logical item to the same key")
        if (source.partition_text, source.sort_text, source.shards, source.shard_by, source.hash,
                source.shard_function, dict(source.fields)) == (
                target.partition_text, target.sort_text, target.shards, target.shard_by, target.hash,
                target.shard_function, dict(target.fields)):
            self.fail("to", "is identical to [from]: nothing would move")
        self.suppliable(source, target, keys)

        cdoc = self.table(doc.get("cleanup", {}), "cleanup", _CLEANUP_KEYS, set())
        ttl = self.string(cdoc["ttl_attribute"], "cleanup.ttl_attribute") if "ttl_attribute" in cdoc else None
        if ttl and ttl in (kp, ks):
            self.fail("cleanup.ttl_attribute", "must not be a key attribute")
        retain = cdoc.get("retain_hours", 168)
        if isinstance(retain, bool) or not isinstance(retain, (int, float)) or not 0 <= retain <= 24 * 366:
            self.fail("cleanup.retain_hours", f"must be a number of hours from 0 to 8784 (got {_describe(retain)})")
        return Migration(mid, table, description, keys, source, target, Cleanup(ttl, float(retain)), text, self.path)

    def layout(self, doc: Any, side: str, keys: Keys) -> LayoutSpec:
        self.table(doc, side, _LAYOUT_KEYS, {"partition", "shards"})
        ptext = self.string(doc["partition"], f"{side}.partition")
        partition = self.template(ptext, f"{side}.partition")
        if "sort" in doc:
            if keys.sort is None:
                self.fail(f"{side}.sort", "the table has no sort key ([keys] sort is not set)")
            stext = self.string(doc["sort"], f"{side}.sort")
            sort = self.template(stext, f"{side}.sort")
        else:
            stext, sort = None, None
        for k, parts in ((f"{side}.partition", partition), (f"{side}.sort", sort or ())):
            for p in parts:
                # A bare ``{PK}`` in the partition (``{SK}`` in the sort) keeps that key as is: a
                # field under its own name. Any other use of a key attribute's name is a mistake.
                own = keys.sort if k.endswith(".sort") else keys.partition
                if p.field is not None and p.field in (keys.partition, keys.sort) \
                        and not (len(parts) == 1 and p.field == own):
                    self.fail(k, f"field {{{p.field}}} is a physical key attribute name; "
                                 "templates name the application's fields")
                if p.field and p.field.startswith(RESERVED_PREFIX):
                    self.fail(k, f"field {{{p.field}}} uses the reserved prefix {RESERVED_PREFIX!r}")
        shard_uses = [p for p in (*partition, *(sort or ())) if p.field == SHARD]
        if len(shard_uses) != 1:
            self.fail(f"{side}.partition", "must contain {shard} exactly once (in the partition or the sort template)"
                      if not shard_uses else "{shard} may appear only once across the templates")

        shards = doc["shards"]
        if isinstance(shards, bool) or not isinstance(shards, int):
            self.fail(f"{side}.shards", f"must be an integer, got {_describe(shards)}")
        if not 1 <= shards <= MAX_SHARDS:
            self.fail(f"{side}.shards", f"must be an integer from 1 to {MAX_SHARDS} (got {shards})")

        fields = self.derived(doc.get("fields", {}), side)
        if SHARD in fields:
            self.fail(f"{side}.fields.{SHARD}", "'shard' is computed by the layout and cannot be derived")

        sb = doc.get("shard_by")
        hash_name = doc.get("hash")
        fn = doc.get("shard_function")
        if sb is None:
            self.fail(f"{side}.shard_by", 'missing: a list of fields to hash, or "random"')
        if sb == "random":
            shard_by = None
            if shards > MAX_RANDOM_SHARDS:
                self.fail(f"{side}.shards", f"a random-suffix layout is limited to {MAX_RANDOM_SHARDS} shards "
                                            "(a read needs every shard's key in one BatchGetItem)")
            if hash_name is not None or fn is not None:
                self.fail(f"{side}.hash", 'has no meaning with shard_by = "random"')
        else:
            if isinstance(sb, str):
                sb = [sb]
            if not isinstance(sb, list) or not sb or not all(isinstance(x, str) and x for x in sb):
                self.fail(f"{side}.shard_by", f'must be a non-empty list of field names or "random" (got {_describe(sb)})')
            for f_ in sb:
                if not _FIELD_RE.match(f_):
                    self.fail(f"{side}.shard_by", f"{f_!r} is not a valid field name")
                if f_ == SHARD:
                    self.fail(f"{side}.shard_by", "cannot hash the shard number itself")
            shard_by = tuple(sb)
            if fn is not None:
                if hash_name is not None:
                    self.fail(f"{side}.shard_function", "set either hash or shard_function, not both")
                self.string(fn, f"{side}.shard_function")
                if not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", fn):
                    self.fail(f"{side}.shard_function", f"must look like 'package.module:function' (got {fn!r})")
                resolve_function(fn, self.path, f"{side}.shard_function")
            else:
                if hash_name is None:
                    hash_name = "sha256"
                if hash_name not in HASHES:
                    self.fail(f"{side}.hash", f"unknown hash {hash_name!r} (known: {', '.join(HASHES)})")
        return LayoutSpec(side, partition, ptext, sort, stext, shards, shard_by,
                          hash_name if shard_by is not None and fn is None else None,
                          fn if shard_by is not None else None, fields)

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
                self.fail(key, f"field {{{n}}} is in no [from] template, shard_by or derived field, "
                               "so no item can supply it")


def resolve_function(spec: str, path: str = "<migration>", key: str = "shard_function"):
    """Import ``package.module:function`` and return the callable (the escape hatch)."""
    mod_name, _, fn_name = spec.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:  # ImportError and whatever the module raises at import
        raise MigrationFileError(path, key, f"cannot import {mod_name!r}: {e}") from None
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise MigrationFileError(path, key, f"{mod_name!r} has no callable {fn_name!r}")
    return fn


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    return f"{type(value).__name__} {value!r}"
