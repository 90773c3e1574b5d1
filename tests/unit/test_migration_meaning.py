"""A migration file is identified by its meaning, not its bytes (issue 27 point 6, PRODUCT.md).

Property tests over every example file of migrations/: writing the same document another way
(comments, blank lines and spaces, key order, quoting of keys and strings, integer notation,
inline tables vs dotted keys vs [section] headers, an explicit default vs an omitted one, another
description) never changes :attr:`Migration.meaning_hash`; changing any meaningful value always
does, and :func:`registered_changes` names the key that changed.
"""

from __future__ import annotations

import copy
import json
import pathlib
import tomllib

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from reshard.core.migration import (MigrationFileError, meaning_changes, meaning_hash, meaning_of, parse,
                                    registered_changes)

ROOT = pathlib.Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "migrations").glob("*.toml"))
DOCS = {p.name: tomllib.loads(p.read_text()) for p in FILES}
SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- a TOML writer with choices

def _key(draw, k: str) -> str:
    bare = k.replace("_", "").replace("-", "").isalnum()
    if bare and not draw(st.integers(0, 4)) == 0:
        return k
    return _basic(k)


def _string(draw, s: str) -> str:
    styles = ["basic"]
    if "'" not in s and "\n" not in s:
        styles.append("literal")
    if '"""' not in s and not s.endswith('"'):
        styles.append("multi-basic")
    if "'''" not in s and not s.endswith("'"):
        styles.append("multi-literal")
    style = draw(st.sampled_from(styles))
    if style == "literal":
        return f"'{s}'"
    if style == "multi-basic":
        return '"""' + s.replace("\\", "\\\\") + '"""'
    if style == "multi-literal":
        return "'''" + s + "'''"
    return _basic(s, ascii_only=draw(st.booleans()))


def _basic(s: str, ascii_only: bool = False) -> str:
    """A TOML basic string (JSON's escapes differ: no surrogate pairs in TOML)."""
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        elif ascii_only and ord(ch) > 0x7E:
            out.append(f"\\U{ord(ch):08X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _value(draw, v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return _string(draw, v)
    if isinstance(v, int):
        forms = [str(v)]
        if v >= 0:
            forms += [hex(v), oct(v).replace("0o", "0o"), f"{v:_}", f"+{v}"]
        return draw(st.sampled_from(forms))
    if isinstance(v, float):
        return draw(st.sampled_from([repr(v), f"{v:.1f}" if v.is_integer() else repr(v)]))
    if isinstance(v, list):
        sep = draw(st.sampled_from([", ", ",", " , ", ",\n  "]))
        trail = draw(st.sampled_from(["", ","])) if v else ""
        return "[" + sep.join(_value(draw, x) for x in v) + trail + "]"
    if isinstance(v, dict):
        return _inline(draw, v)
    raise TypeError(v)


def _inline(draw, d: dict) -> str:
    items = list(d.items())
    order = draw(st.permutations(items))
    return "{ " + ", ".join(f"{_key(draw, k)} = {_value(draw, v)}" for k, v in order) + " }"


def _comment(draw) -> str:
    return draw(st.sampled_from(["", "", "  # a comment", "\t# why: the article's schema", " #"]))


def _assign(draw, key: str, value) -> str:
    eq = draw(st.sampled_from([" = ", "=", "  =  ", "\t= "]))
    return f"{key}{eq}{_value(draw, value)}{_comment(draw)}"


def _render(draw, path: list[str], d: dict, style: str) -> tuple[list[str], list[tuple[list[str], list[str]]]]:
    """(lines in the current table, [(header path, lines) of sections after it])."""
    body: list[str] = []
    sections: list[tuple[list[str], list[str]]] = []
    items = list(draw(st.permutations(list(d.items()))))
    scalars = [(k, v) for k, v in items if not isinstance(v, dict)]
    tables = [(k, v) for k, v in items if isinstance(v, dict)]
    for k, v in scalars:
        body.append(_assign(draw, _key(draw, k), v))
    for k, v in tables:
        sub = style if style in ("inline", "dotted") else draw(st.sampled_from(["header", "inline", "dotted"]))
        if sub == "inline" or not v:
            body.append(_assign(draw, _key(draw, k), v))
        elif sub == "dotted":
            inner, _ = _render(draw, [], v, "dotted")
            body += [f"{_key(draw, k)}.{line}" for line in inner]
        else:
            inner, more = _render(draw, [*path, k], v, "header")
            sections.append(([*path, k], inner))
            sections += more
    return body, sections


def write(draw, doc: dict) -> str:
    """``doc`` as TOML text, written one of many ways."""
    body, sections = _render(draw, [], doc, "header")
    out = [draw(st.sampled_from(["", "# migration file\n", "\n\n"]))] + body
    for path, lines in sections:
        if not lines and draw(st.booleans()):
            continue  # a table with only sub-tables is defined by them
        out.append("")
        out.append(("# section\n" if draw(st.booleans()) else "") + "[" + ".".join(_key(draw, k) for k in path)
                   + "]" + _comment(draw))
        out += lines
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- defaults written out or left out

def _layouts(doc: dict):
    for side in ("from", "to"):
        if side in doc:
            yield doc[side]
    for ix in doc.get("index", {}).values():
        yield ix["from"]
        yield ix["to"]


def same_meaning_variant(draw, doc: dict) -> dict:
    d = copy.deepcopy(doc)
    for lay in _layouts(d):
        sb = lay.get("shard_by")
        if isinstance(sb, list) and len(sb) == 1 and draw(st.booleans()):
            lay["shard_by"] = sb[0]
        elif isinstance(sb, str) and sb != "random" and draw(st.booleans()):
            lay["shard_by"] = [sb]
        if sb != "random" and "shard_function" not in lay:
            if "hash" not in lay and draw(st.booleans()):
                lay["hash"] = "sha256"
            elif lay.get("hash") == "sha256" and draw(st.booleans()):
                del lay["hash"]
    cleanup = d.setdefault("cleanup", {})
    if "retain_hours" not in cleanup and draw(st.booleans()):
        cleanup["retain_hours"] = draw(st.sampled_from([168, 168.0]))
    elif cleanup.get("retain_hours") == 168 and draw(st.booleans()):
        del cleanup["retain_hours"]
    if not cleanup and draw(st.booleans()):
        del d["cleanup"]
    for ix in d.get("index", {}).values():
        if "type" not in ix and draw(st.booleans()):
            exact = all(ix[s]["partition"] == "{shard}" for s in ("from", "to"))
            ix["type"] = "N" if exact else "S"
    choice = draw(st.sampled_from(["keep", "drop", "other"]))
    if choice == "drop":
        d.pop("description", None)
    elif choice == "other":
        d["description"] = draw(st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=30))
    return d


@pytest.mark.parametrize("name", sorted(DOCS))
@SETTINGS
@given(data=st.data())
def test_writing_a_file_another_way_never_changes_its_meaning(name, data):
    base = parse((ROOT / "migrations" / name).read_text(), name)
    text = write(data.draw, same_meaning_variant(data.draw, DOCS[name]))
    again = parse(text, "rewritten.toml")
    assert again.meaning_hash == base.meaning_hash, (text, meaning_changes(base.meaning(), again.meaning()))
    assert registered_changes(again, base.text, base.content_hash, base.meaning_hash) == []
    # An old row (no meaning hash stored): the registered text is parsed and compared.
    assert registered_changes(again, base.text, base.content_hash) == []


# --------------------------------------------------------------------------- changes of meaning

def _set(doc: dict, path: tuple, value) -> None:
    d = doc
    for k in path[:-1]:
        d = d.setdefault(k, {})
    d[path[-1]] = value


def _get(doc: dict, path: tuple):
    d = doc
    for k in path:
        d = d[k]
    return d


def mutations(doc: dict) -> list[tuple[tuple, object, str]]:
    """(path, new value, the dotted key the change is reported under) for every meaningful value."""
    out = [(("id",), doc["id"] + "-b", "id"), (("table",), doc["table"] + "B", "table"),
           (("keys", "partition"), "PK2", "keys.partition"),
           (("cleanup", "ttl_attribute"), "gone_at", "cleanup.ttl_attribute"),
           (("cleanup", "retain_hours"), 12, "cleanup.retain_hours")]
    sides = [((side,), side) for side in ("from", "to") if side in doc]
    sides += [(("index", n, side), f"index.{n}.{side}") for n in doc.get("index", {}) for side in ("from", "to")]
    for path, dotted in sides:
        lay = _get(doc, path)
        out.append((path + ("shards",), lay["shards"] + 1, f"{dotted}.shards"))
        out.append((path + ("partition",), lay["partition"] + "~x", f"{dotted}.partition"))
        if lay.get("shard_by") != "random" and "shard_function" not in lay:
            out.append((path + ("hash",), "md5" if lay.get("hash", "sha256") != "md5" else "sha256", f"{dotted}.hash"))
        if "sort" in lay:
            out.append((path + ("sort",), lay["sort"] + "~y", f"{dotted}.sort"))
        for f, spec in lay.get("fields", {}).items():
            out.append((path + ("fields", f, "format"), spec["format"] + "-x", f"{dotted}.fields.{f}.format"))
    for n in doc.get("index", {}):
        out.append((("index", n, "sort"), "other_sort", f"index.{n}.sort"))
    return out


@pytest.mark.parametrize("name", sorted(DOCS))
@SETTINGS
@given(data=st.data())
def test_changing_any_meaningful_value_always_changes_the_hash(name, data):
    base = parse((ROOT / "migrations" / name).read_text(), name)
    doc = same_meaning_variant(data.draw, DOCS[name])
    path, value, dotted = data.draw(st.sampled_from(mutations(doc)))
    _set(doc, path, value)
    text = write(data.draw, doc)
    try:
        changed = parse(text, "changed.toml")
    except MigrationFileError:
        assume(False)  # the change made the file invalid (e.g. [to] identical to [from]): not a case
    assert changed.meaning_hash != base.meaning_hash
    found = registered_changes(changed, base.text, base.content_hash, base.meaning_hash)
    assert any(c.startswith(f"{dotted}: ") for c in found), (dotted, found)
    assert registered_changes(changed, base.text) == found  # an old row: the same answer by parsing


def test_every_mutation_of_every_file_is_seen():
    """Not left to chance: each listed change of each example file, written plainly."""
    seen = 0
    for name, doc in DOCS.items():
        base = parse((ROOT / "migrations" / name).read_text(), name)
        for path, value, dotted in mutations(doc):
            d = copy.deepcopy(doc)
            _set(d, path, value)
            try:
                changed = parse(_plain(d), "changed.toml")
            except MigrationFileError:
                continue
            seen += 1
            assert changed.meaning_hash != base.meaning_hash, (name, dotted)
            assert any(c.startswith(f"{dotted}: ") for c in meaning_changes(base.meaning(), changed.meaning()))
    assert seen >= 60


def _plain(doc: dict) -> str:
    """``doc`` written with inline tables only (no choices)."""
    return "\n".join(f"{json.dumps(k)} = {_plain_value(v)}" for k, v in doc.items()) + "\n"


def _plain_value(v) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_plain_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(_plain_value(x) for x in v) + "]"
    return json.dumps(v)


def test_the_change_is_named_as_an_operator_reads_it():
    text = (ROOT / "migrations" / "0001_sensor_events.toml").read_text()
    changed = parse(text.replace("shards = 32", "shards = 64").replace("retain_hours = 168", "retain_hours = 24"))
    assert registered_changes(changed, text) == ["cleanup.retain_hours: 168 -> 24", "to.shards: 32 -> 64"]
    assert meaning_hash(meaning_of(changed)).startswith("m1:")


def test_description_is_not_meaning_and_the_same_bytes_match_at_once():
    text = (ROOT / "migrations" / "0001_sensor_events.toml").read_text()
    m = parse(text.replace("Sensor bursts", "Bursts"))
    assert registered_changes(m, text) == []
    # The same bytes never parse the registered text (an old row, a shim of an earlier release).
    assert registered_changes(parse(text), "not even toml", parse(text).content_hash) == []
