"""Holes an adversarial review found in the combined-migration session, each a test that failed
before its fix: a paged index query over a 38-digit Number sort key (shim/query._number_beside),
a lean answer orjson cannot parse (aws/lean._loads, UnreadableAnswer), and index verify over a
derived GSI partition field (jobs/index_jobs.IndexVerifier._read_index: each value read once)."""

from __future__ import annotations

from decimal import Decimal

from reshard.aws.local import wait_active
from reshard.core.migration import parse
from tests.integration.test_shim_combined_index import INDEX, combined
from tests.index_support import gsi_migration
from tests.shim_helpers import shim

# 30 significant digits: ``v - 1`` in Python's default Decimal context (28 digits) rounds UP.
BIG = Decimal("123456789012345678901234567890")


def numeric_sort_table(dynalite, name: str) -> None:
    dynalite.call("create_table", TableName=name, BillingMode="PAY_PER_REQUEST",
                  AttributeDefinitions=[{"AttributeName": a, "AttributeType": t} for a, t in
                                        (("PK", "S"), ("gsi_shard", "N"), ("amount", "N"))],
                  KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}],
                  GlobalSecondaryIndexes=[{"IndexName": INDEX, "Projection": {"ProjectionType": "ALL"}, "KeySchema": [
                      {"AttributeName": "gsi_shard", "KeyType": "HASH"},
                      {"AttributeName": "amount", "KeyType": "RANGE"}]}])
    wait_active(dynalite, name)


def test_paged_index_query_over_a_38_digit_numeric_sort_key_misses_nothing(dynalite, unique_name):
    """A combined migration whose GSI sort key is a Number (``amount``). Three invoices of one
    customer: two tie at a 30-digit amount, one 5 above it. Paged with Limit=1 (cursors passed
    back as returned) the query must give the three, as the whole query does. It gave only
    invoices 1 and 3: page 2 starts after ``BIG - 1``, which the 28-digit context rounds to
    1.234567890123456789012345679E+29 > BIG, so the tie group at BIG is not read again and
    invoice 2 was missed. Now the value beside the cursor is computed exactly, rounded away from it."""
    numeric_sort_table(dynalite, unique_name)
    m = parse(combined(unique_name).replace('sort = "tx_country"', 'sort = "amount"'), "<combined-numeric>")
    t = shim(m, dynalite, "dual_write", query_workers=1)
    for invoice, amount in (("1", BIG), ("2", BIG), ("3", BIG + 5)):
        t.put_item(Item={"invoice": invoice, "customer": "c", "amount": amount, "gsi_shard": 0})
    whole = t.query(IndexName=INDEX, Key={"customer": "c"})
    assert sorted(i["invoice"] for i in whole["Items"]) == ["1", "2", "3"]
    got, start = [], None
    for _ in range(10):
        page = t.query(IndexName=INDEX, Key={"customer": "c"}, Limit=1,
                       **({"ExclusiveStartKey": start} if start else {}))
        got += [i["invoice"] for i in page["Items"]]
        start = page.get("LastEvaluatedKey")
        if not start:
            break
    assert sorted(got) == ["1", "2", "3"]


def test_the_lean_scan_answers_what_botocore_answers_for_a_string_orjson_refuses(dynalite, unique_name):
    """dynalite stores a string with a lone surrogate (sent escaped, as botocore sends it) and
    botocore's Scan returns both items. The lean Scan returned ``{}`` as a *successful* answer
    (what the jobs read as the last page of the segment: backfill copied nothing of it and
    verify checked nothing of it). Now it falls back to the standard parser, and a 2xx body
    neither reads raises (test_lean_dynalite covers that)."""
    dynalite.call("create_table", TableName=unique_name, BillingMode="PAY_PER_REQUEST",
                  AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"}],
                  KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}])
    wait_active(dynalite, unique_name)
    client = dynalite.client
    client.put_item(TableName=unique_name, Item={"PK": {"S": "a"}, "x": {"S": "ok\ud800"}})
    client.put_item(TableName=unique_name, Item={"PK": {"S": "b"}, "x": {"S": "fine"}})
    plain = client.scan(TableName=unique_name, ConsistentRead=True)
    assert len(plain["Items"]) == 2  # botocore's answer
    lean = dynalite.call("scan", TableName=unique_name, ConsistentRead=True)
    assert sorted(i["PK"]["S"] for i in lean.get("Items", [])) == ["a", "b"]


def days(table: str) -> str:
    """``{day}#{shard}``, ``day`` derived from ``ts``: 4 random -> hash(customer) % 8."""
    return gsi_migration("gsi-day", table, old_shards=4, new_shards=8, old_partition="{day}#{shard}",
                         new_partition="{day}#{shard}",
                         fields='fields = { day = { from = "ts", format = "%Y-%m-%d" } }')


def test_index_verify_reads_a_derived_bucket_s_partitions_once(dynalite, unique_name):
    """``{day}#{shard}`` with ``day`` derived from ``ts``: four headers of one day (four
    distinct timestamps). The index side must read that day's 8 [to] values once and find no
    suspect, as for ``{region}#{shard}``. It read them four times (32 queries, 16 entries)
    and all four headers were suspects (a day of a million items: 10^12 entry records)."""
    from reshard import operations
    from reshard.jobs.runner import JobOptions
    from tests.index_support import create_gsi_table, header, setup_index_migration

    opts = dict(segments=2, lease_seconds=15, settle_seconds=0)
    create_gsi_table(dynalite, unique_name, partition_type="S")
    m, store = setup_index_migration(dynalite, unique_name, unique_name + "-ctl", days(unique_name),
                                     mid="gsi-day")
    for i in range(4):
        dynalite.call("put_item", TableName=unique_name, Item=dict(
            header(i, 0), ts={"S": f"2024-01-05T1{i}:00:00"}, gsi_shard={"S": f"2024-01-05#{i % 4}"}))
    assert operations.run_data_job("backfill", dynalite, store, m.id, JobOptions(**opts)).done
    ok = operations.verify_read_only(dynalite, store, m.id, JobOptions(**opts))
    assert ok.passed, ok.differences
    assert (ok.totals["index_queries"], ok.totals["index_entries"], ok.totals["suspects"]) == (8, 4, 0), ok.totals
