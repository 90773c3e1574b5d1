"""What the behaviours need to know of a table: its key, its indexes, its ARN; asked of upstream once.

The proxy describes a table (``DescribeTable`` to upstream, its own signed request) the first
time a behaviour needs it, and forgets it when a CreateTable, DeleteTable or UpdateTable of
that name passes through.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass(frozen=True)
class IndexInfo:
    name: str
    key: tuple[str, ...]            # hash first
    projection: str                 # ALL | KEYS_ONLY | INCLUDE
    non_key: tuple[str, ...] = ()
    is_global: bool = True

    def project(self, item: dict, table_key: tuple[str, ...]) -> dict:
        """``item`` as this index stores it (its projection)."""
        if self.projection == "ALL":
            return item
        keep = set(self.key) | set(table_key) | set(self.non_key)
        return {k: v for k, v in item.items() if k in keep}


@dataclass(frozen=True)
class TableInfo:
    name: str
    arn: str
    key: tuple[str, ...]            # hash first
    billing: str                    # PAY_PER_REQUEST | PROVISIONED
    indexes: dict = field(default_factory=dict)

    def key_of(self, item: dict) -> tuple | None:
        """A hashable identity of ``item``'s primary key (None when an attribute is missing)."""
        try:
            return tuple(next(iter(item[a].items())) for a in self.key)
        except (KeyError, StopIteration, AttributeError):
            return None

    def key_item(self, item: dict) -> dict:
        return {a: item[a] for a in self.key}


def parse_description(desc: dict) -> TableInfo:
    def schema(ks):
        return tuple(k["AttributeName"] for k in sorted(ks, key=lambda k: k["KeyType"] != "HASH"))

    indexes = {}
    for kind, is_global in (("GlobalSecondaryIndexes", True), ("LocalSecondaryIndexes", False)):
        for ix in desc.get(kind) or ():
            proj = ix.get("Projection") or {}
            indexes[ix["IndexName"]] = IndexInfo(ix["IndexName"], schema(ix["KeySchema"]),
                                                 proj.get("ProjectionType", "ALL"),
                                                 tuple(proj.get("NonKeyAttributes") or ()), is_global)
    billing = (desc.get("BillingModeSummary") or {}).get("BillingMode") or (
        "PAY_PER_REQUEST" if not (desc.get("ProvisionedThroughput") or {}).get("ReadCapacityUnits") else "PROVISIONED")
    arn = desc.get("TableArn") or f"arn:aws:dynamodb:us-east-1:000000000000:table/{desc['TableName']}"
    return TableInfo(desc["TableName"], arn, schema(desc["KeySchema"]), billing, indexes)


class Tables:
    """The cache of table descriptions (see the module docstring)."""

    def __init__(self, describe):
        self._describe = describe   # name -> DescribeTable's Table dict, or None
        self._known: dict[str, TableInfo] = {}
        self._lock = threading.Lock()

    def get(self, name: str | None) -> TableInfo | None:
        if not name:
            return None
        with self._lock:
            if name in self._known:
                return self._known[name]
        desc = self._describe(name)
        info = parse_description(desc) if desc else None
        if info is None or desc.get("TableStatus", "ACTIVE") != "ACTIVE":
            return info  # not cached: a table created upstream directly, or still CREATING, is asked again
        with self._lock:
            self._known[name] = info
        return info

    def forget(self, name: str | None) -> None:
        with self._lock:
            self._known.pop(name, None)
