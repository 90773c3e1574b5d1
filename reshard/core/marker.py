"""The table marker: one item in the data table naming the migration that owns its layout.

Pure domain module. See docs/late-writes.md ("The table marker").

A shim whose control table is mistyped never sees the migration in it, and one still running
an earlier migration's file sees that migration finished: both would write a layout nobody
reads. The marker is a fact they cannot miss, because it is in the table they write: ``start``
writes it before registering the migration, every shim reads it (one consistent GetItem) at
every refresh as part of the fact its requests obey, and :func:`refusal` says when a shim must
refuse. It stays after ``complete``; a retire puts back the owner it replaced.

Its key is reserved per key type, so it fits any table: S ``_reshard#marker``, N a reserved
number, B a reserved byte string (a sort key likewise). Jobs, ``plan``, ``verify`` and the shim
skip it (:func:`is_marker`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from reshard.core.migration import RESERVED_PREFIX

#: The attribute that makes an item the marker (and holds the owning migration's id).
MARKER_ATTR = RESERVED_PREFIX + "marker"
#: The control table the owning migration is registered in.
CONTROL_ATTR = RESERVED_PREFIX + "control"
#: The owner the marker replaced (``<migration id>\n<control table>``), restored by a retire.
PREVIOUS_ATTR = RESERVED_PREFIX + "prev"

_KEY_VALUES = {
    "S": {"S": "_reshard#marker"},
    "N": {"N": "-9.87654321012345678909876543210123456E-128"},
    "B": {"B": b"\x00_reshard#marker\x00"},
}


def marker_key(partition: str, partition_type: str, sort: str | None = None,
               sort_type: str | None = None) -> dict:
    """The marker's physical key (wire format) in a table with this key schema."""
    key = {partition: dict(_KEY_VALUES[partition_type])}
    if sort:
        key[sort] = dict(_KEY_VALUES[sort_type or "S"])
    return key


def is_marker(item: Mapping[str, Any] | None) -> bool:
    """Whether a scanned or read item is the marker (never an application item)."""
    return bool(item) and MARKER_ATTR in item


@dataclass(frozen=True)
class Owner:
    """What a marker says: the migration that owns the table's layout, and where it is registered."""

    migration_id: str
    control_table: str
    previous: "Owner | None" = None

    def text(self) -> str:
        return f"migration {self.migration_id!r} (control table {self.control_table!r})"


def marker_item(key: Mapping[str, Any], owner: Owner) -> dict:
    """The marker item (wire format) for ``owner``."""
    item = dict(key)
    item[MARKER_ATTR] = {"S": owner.migration_id}
    item[CONTROL_ATTR] = {"S": owner.control_table}
    if owner.previous is not None:
        item[PREVIOUS_ATTR] = {"S": f"{owner.previous.migration_id}\n{owner.previous.control_table}"}
    return item


def owner_of(item: Mapping[str, Any] | None) -> Owner | None:
    """The owner a marker item names (None: no marker, or one too damaged to read)."""
    if not is_marker(item):
        return None
    mid = item.get(MARKER_ATTR, {}).get("S")
    ctl = item.get(CONTROL_ATTR, {}).get("S")
    if not isinstance(mid, str) or not isinstance(ctl, str) or not mid or not ctl:
        return None
    prev = None
    raw = item.get(PREVIOUS_ATTR, {}).get("S")
    if isinstance(raw, str) and "\n" in raw:
        pid, _, pctl = raw.partition("\n")
        if pid and pctl:
            prev = Owner(pid, pctl)
    return Owner(mid, ctl, prev)


def refusal(owner: Owner | None, *, my_migration: str, my_control_table: str, registered: bool,
            owner_active: bool | None) -> str | None:
    """Why a shim must refuse to serve the table, or None.

    ``registered``: the shim's own migration is registered in its control table;
    ``owner_active``: whether the marker's migration is active (None: unknown, e.g. it is
    registered in a control table the shim does not read -- that already refuses).
    """
    if owner is None:
        return None
    if owner.control_table != my_control_table:
        return (f"the table is owned by {owner.text()}, but this shim reads control table "
                f"{my_control_table!r}: its phase is invisible here (check control_table= / "
                "RESHARD_CONTROL_TABLE)")
    if owner.migration_id == my_migration:
        return None
    if owner_active or registered:
        why = "is in progress" if owner_active else "now owns the layout"
        return (f"the table's {owner.text()} {why}; this shim runs migration {my_migration!r}: deploy "
                f"{owner.migration_id!r}'s migration file (or ShardedTable.from_migration_id)")
    return None  # the next migration's file deployed before its `start`: steady state is right
