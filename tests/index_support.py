"""Test helpers for index-only migrations ([index.NAME]): a table with a sharded GSI, the file, the phases."""

from __future__ import annotations

from reshard.aws.local import wait_active
from reshard.control.store import ControlStore
from reshard.control.transition import transition
from reshard.core.migration import parse
from reshard.core.phases import Action

from tests.conftest import ROOT

INVOICES_GSI = ROOT / "migrations" / "0005_invoices_gsi.toml"

def gsi_migration(mid: str = "gsi-mig", table: str = "InvoiceTransactions", *, old_shards: int = 4,
                  new_shards: int = 16, shard_by: str = "customer", new_partition: str = "{shard}",
                  old_partition: str = "{shard}", fields: str = "") -> str:
    """An index-only migration of the invoice article's ByCountry index (random ``old_shards`` ->
    ``hash(shard_by) % new_shards``). The default hashes a non-key field (``customer``): a shim
    write that changes it changes the item's new GSI value, so a stale rewrite would be visible.
    ``fields``: a ``fields = {...}`` line (derived fields) given to both layouts."""
    derived = f"\n{fields}" if fields else ""
    return f"""\
id = "{mid}"
table = "{table}"

[keys]
partition = "PK"
sort = "SK"

[index.ByCountry]
partition = "gsi_shard"
sort = "tx_country"

[index.ByCountry.from]
partition = "{old_partition}"
shards = {old_shards}
shard_by = "random"{derived}

[index.ByCountry.to]
partition = "{new_partition}"
shards = {new_shards}
shard_by = ["{shard_by}"]{derived}
"""


def create_gsi_table(dynamo, table: str, projection: dict | None = None, partition_type: str = "N",
                     index: str = "ByCountry") -> None:
    """PK/SK table with GSI ``index`` (gsi_shard, tx_country), on-demand, ACTIVE on return."""
    dynamo.call("create_table", TableName=table, BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[{"AttributeName": a, "AttributeType": t} for a, t in
                                      (("PK", "S"), ("SK", "S"), ("gsi_shard", partition_type), ("tx_country", "S"))],
                KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}, {"AttributeName": "SK", "KeyType": "RANGE"}],
                GlobalSecondaryIndexes=[{"IndexName": index, "KeySchema": [
                    {"AttributeName": "gsi_shard", "KeyType": "HASH"},
                    {"AttributeName": "tx_country", "KeyType": "RANGE"}],
                    "Projection": projection or {"ProjectionType": "ALL"}}])
    wait_active(dynamo, table)


def header(i: int, shard: int, country: str = "USA", customer: str | None = None) -> dict:
    """An invoice header row (wire) as the application wrote it before the migration."""
    return {"PK": {"S": f"InvoiceNumber#{121212 + i}"}, "SK": {"S": "root"}, "tx_country": {"S": country},
            "customer": {"S": customer or f"c-{i}"}, "amount": {"N": str(100 + i)}, "gsi_shard": {"N": str(shard)}}


def setup_index_migration(dynamo, table: str, control: str, text: str | None = None, mid: str = "gsi-mig",
                          phases: int = 3):
    """Register the index-only migration and advance it ``phases`` times (3: to backfill; no shims)."""
    text = text or gsi_migration(mid, table)
    m = parse(text, "<gsi>")
    store = ControlStore(dynamo, control)
    store.ensure_table()
    store.register(m)
    for _ in range(phases):
        transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    return m, store
