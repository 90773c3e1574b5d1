"""dynalite's item order, so a stale page can show an item where dynalite's Scan or Query would have.

dynalite (4.x, ``db/index.js``) keeps a table's items in LevelDB under a string key and
serves Scan and Query as ranges of it:

* a table item's key is ``createKey``: ``hashPrefix(hash)`` (the first 6 hex digits of
  ``md5("Outliers" + hash bytes)``) ``/`` ``toRangeStr(hash)`` ``/`` [``toRangeStr(range)`` ``/``];
* an index entry's key is ``createIndexKey``: ``createKey`` over the index's key schema, then
  ``hashPrefix(table hash, table range)``;
* Scan segment ``s`` of ``T`` holds the keys after the 3-hex-digit prefix ``ceil(4096 s / T)``
  and before ``(ceil(4096 (s + 1) / T) - 1)`` ``~``;
* ``toRangeStr``: S as hex of its UTF-8 bytes, B as hex of its bytes, N as ``toLexiStr``
  (sign, a biased exponent, the digits; negative numbers complemented) so that string order
  is number order.

Ported as it is (``tests/integration/test_fidelity_ordering.py`` checks it against dynalite's
own Scan order); a different upstream (moto) orders otherwise, and then a stale read only
changes or drops the items of a page, never inserts one (``Behaviours`` knows which upstream).
"""

from __future__ import annotations

import base64
import hashlib
import math
from decimal import Decimal


def _big(text: str) -> tuple[int, list[int], int]:
    """Big.js's (sign, digits without leading/trailing zeros, exponent of the first digit)."""
    d = Decimal(text)
    if d == 0:
        return 1, [0], 0
    sign, digits, exponent = d.normalize().as_tuple()
    digits = list(digits)
    return (-1 if sign else 1), digits, len(digits) - 1 + exponent


def to_lexi_str(value: dict) -> str:
    (t, v), = value.items()
    if t == "B":
        return base64.b64decode(v).hex()
    if t != "N":
        return v
    s, c, e = _big(v)
    exp = 0 if not c[0] else (125 - e if s == -1 else 130 + e)
    if s == -1:
        # Big(10).plus(-c0.c1c2...) in plain notation without its point (dynalite sets e = 0 first)
        rest = Decimal(10) - Decimal(str(c[0]) + "." + "".join(map(str, c[1:])) if len(c) > 1 else str(c[0]))
        digits = format(rest.normalize(), "f").replace(".", "")
    else:
        digits = "".join(map(str, c))
    return ("0" if s == -1 else "1") + format(exp, "02x")[-2:] + digits


def to_range_str(value: dict) -> str:
    (t, v), = value.items()
    if t == "S":
        return v.encode("utf-8").hex()
    return to_lexi_str(value)


def _num_to_buffer(text: str) -> bytes:
    if Decimal(text) == 0:
        return bytes([0x80])
    scale, mantissa, e = _big(text)
    exponent = e + 1
    append_zero = 1 if exponent % 2 else 0
    length = (len(mantissa) + append_zero + 1) // 2
    if length < 20 and scale == -1:
        out = [0] * (length + 2)
        out[length + 1] = 102
    else:
        out = [0] * (length + 1)
    out[0] = math.floor((exponent + append_zero) / 2) - 64
    if scale == -1:
        out[0] ^= 0xFFFFFFFF
    i, appended = 0, False
    while i < len(mantissa):
        j = (i + append_zero) // 2 + 1
        if append_zero and not i and not appended:
            out[j] = 0
            appended = True
            i -= 1
        elif (i + append_zero) % 2 == 0:
            out[j] = mantissa[i] * 10
        else:
            out[j] += mantissa[i]
        if (i + append_zero) % 2 or i == len(mantissa) - 1:
            out[j] = 101 - out[j] if scale == -1 else out[j] + 1
        i += 1
    return bytes(x & 0xFF for x in out)


def _key_bytes(value: dict) -> bytes:
    (t, v), = value.items()
    if t == "S":
        return v.encode("utf-8")
    if t == "N":
        return _num_to_buffer(v)
    return base64.b64decode(v)


def hash_prefix(hash_value: dict, range_value: dict | None = None) -> str:
    h = hashlib.md5(b"Outliers")
    h.update(_key_bytes(hash_value))
    if range_value is not None:
        h.update(_key_bytes(range_value))
    return h.hexdigest()[:6]


def create_key(item: dict, schema: list[str]) -> str:
    """``createKey``: ``schema`` is the key attribute names, hash first."""
    hash_value = item[schema[0]]
    out = hash_prefix(hash_value) + "/" + to_range_str(hash_value) + "/"
    if len(schema) > 1:
        out += to_range_str(item[schema[1]]) + "/"
    return out


def create_index_key(item: dict, table_schema: list[str], index_schema: list[str]) -> str:
    """``createIndexKey``: the index's ``createKey`` and the table key's hash prefix."""
    table_range = item[table_schema[1]] if len(table_schema) > 1 else None
    return create_key(item, index_schema) + hash_prefix(item[table_schema[0]], table_range)


def segment_bounds(segment: int, total: int) -> tuple[str | None, str | None]:
    """The (exclusive) lower and upper bound of Scan segment ``segment`` of ``total`` (None: none)."""
    if total <= 1:
        return None, None
    low = format(math.ceil(4096 * segment / total), "03x")[-3:] if segment > 0 else None
    high = format(math.ceil(4096 * (segment + 1) / total) - 1, "03x")[-3:] + "~"
    return low, high
