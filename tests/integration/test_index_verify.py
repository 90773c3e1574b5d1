"""Index verify on dynalite: the full fan-out over the [to] GSI values against the scan.

The index's answers are edited by a stub on the job's client (``Dynamo.call`` for an index
Query: every page of the join's fan-out *and* every targeted re-check query), so an entry
dropped, added or altered there persists as a broken index would; dynalite keeps its own
index right. Each kind of break must fail the run with an example; a real shim write
between the scan and the index side must not.
"""

from __future__ import annotations

import pytest

from reshard import operations
from reshard.core.layout import hash_shard
from reshard.jobs.runner import JobOptions

from tests.index_support import create_gsi_table, gsi_migration, header, setup_index_migration

OPTS = dict(segments=2, lease_seconds=15, settle_seconds=0)
VICTIM = {"S": "InvoiceNumber#121215"}  # header(3)


def _migrated(dynalite, table: str, items: int = 12):
    """A table whose headers the backfill moved to their [to] values (the phase is backfill)."""
    create_gsi_table(dynalite, table)
    m, store = setup_index_migration(dynalite, table, table + "-ctl")
    for i in range(items):
        dynalite.call("put_item", TableName=table, Item=header(i, shard=i % 4))
    assert operations.run_data_job("backfill", dynalite, store, m.id, JobOptions(**OPTS)).done
    return m, store


def _client(server):
    from reshard.aws.dynamo import Dynamo, RetryPolicy
    return Dynamo(endpoint_url=server.endpoint, region="us-east-1", retry=RetryPolicy(max_attempts=5, base_seconds=0.01),
                  connect_timeout=1, read_timeout=4)


@pytest.fixture(scope="module")
def invoices(dynalite_server):
    """One migrated table for the tests that only read it (each stubs a client of its own)."""
    import uuid
    m, _ = _migrated(_client(dynalite_server), f"t-index-verify-{uuid.uuid4().hex[:6]}")
    return m


@pytest.fixture
def shared(invoices, dynalite_server):
    """(a fresh client, the control store on it, the migration) of the module's table."""
    from reshard.control.store import ControlStore
    client = _client(dynalite_server)
    return client, ControlStore(client, invoices.table + "-ctl"), invoices


def _look(client, store, m, **opts):
    """A read-only verify (``--no-record``): writes nothing, so the module's table stays as it is."""
    return operations.verify_read_only(client, store, m.id, JobOptions(**dict(OPTS, **opts)))


def _stub_index(dynalite, edit) -> list:
    """Pass every index Query answer of ``dynalite`` through ``edit(request, items) -> items``;
    returns the list of requests seen."""
    call, seen = dynalite.call, []

    def stubbed(op, **kw):
        resp = call(op, **kw)
        if op == "query" and kw.get("IndexName"):
            seen.append(kw)
            resp = dict(resp, Items=edit(kw, list(resp.get("Items", []))))
        return resp

    dynalite.call = stubbed
    return seen


def _verify(dynalite, store, m):
    return operations.run_data_job("verify", dynalite, store, m.id, JobOptions(**OPTS))


def test_a_clean_index_passes_and_the_index_side_is_counted(shared, tmp_path):
    client, store, m = shared
    seen = _stub_index(client, lambda kw, items: items)
    ok = operations.run_data_job("verify", client, store, m.id, JobOptions(**OPTS, records_dir=str(tmp_path)))
    assert ok.passed, ok.differences
    assert not list(tmp_path.rglob("run-*"))  # the records went with the join
    t = ok.totals
    # Every one of the 16 [to] values read, each header once, no suspect.
    assert t["index_queries"] == 16 and t["index_entries"] == 12 and t["suspects"] == 0
    assert 0 < t["index_rcu"] <= t["rcu"]
    assert sorted(kw["ExpressionAttributeValues"][":rsg"]["N"] for kw in seen) == sorted(str(v) for v in range(16))


def _drop_victim(kw, items):
    return [e for e in items if e["PK"] != VICTIM]


def _add_ghost(kw, items):
    """An entry for a table key that holds no item, at its value (what a lagging delete leaves)."""
    ghost = {"PK": {"S": "InvoiceNumber#999"}, "SK": {"S": "root"}, "gsi_shard": {"N": "5"},
             "tx_country": {"S": "USA"}}
    values = kw["ExpressionAttributeValues"]
    wanted = values[":rsg"] == {"N": "5"} and values.get(":rsk0", ghost["PK"]) == ghost["PK"]
    return items + [ghost] if wanted else items


def _other_sort(kw, items):
    return [dict(e, tx_country={"S": "FRA"}) if e["PK"] == VICTIM else e for e in items]


def _older_version(kw, items):
    return [dict(e, _rs_v={"S": "1000000000000.000000.old"}) if e["PK"] == VICTIM else e for e in items]


@pytest.mark.parametrize("edit, kind, detail", [
    (_drop_victim, "gsi_missing", "the index returns no entry for it"),
    (_add_ghost, "gsi_extra", "the table item is absent; the index returns 1 entry"),
    (_other_sort, "gsi_differs", "its index entry has tx_country 'FRA'"),
    (_older_version, "gsi_differs", "its index entry has version 1000000000000.000000.old"),
], ids=["missing", "extra", "sort", "version"])
def test_a_broken_index_fails_with_an_example(shared, edit, kind, detail):
    client, store, m = shared
    _stub_index(client, edit)
    failed = _look(client, store, m)
    assert failed.finished and not failed.passed
    assert {k: n for k, n in failed.differences.items() if n} == {kind: 1}
    (example,) = failed.examples
    assert example["kind"] == kind and detail in example["detail"]
    assert ("999" if kind == "gsi_extra" else "121215") in example["old_key"]


def test_a_shim_write_between_the_scan_and_the_index_side_does_not_fail_it(dynalite, unique_name):
    """After every scan segment recorded the victim, a real shim (backfill phase: it writes the
    [to] value) re-puts it with another customer: a new ``_rs_v`` and another GSI value. The
    join sees the scan's old entry missing and the new one unrecorded: a suspect, re-checked
    on the item's new state, where table and index agree."""
    from reshard.core.phases import Phase
    from tests.shim_helpers import shim

    m, store = _migrated(dynalite, unique_name)
    assert hash_shard("c-moved", 16, "sha256") != hash_shard("c-3", 16, "sha256")
    wrote = []

    def write_once(kw, items):
        if not wrote and "FilterExpression" not in kw:  # the join's first fan-out query
            t = shim(m, dynalite, phase=Phase.BACKFILL)
            try:
                t.put_item(Item={"PK": VICTIM["S"], "SK": "root", "tx_country": "USA", "customer": "c-moved",
                                 "amount": 1, "gsi_shard": 0})
            finally:
                t.close()
            wrote.append(True)
        return items

    _stub_index(dynalite, write_once)
    ok = _verify(dynalite, store, m)
    assert wrote and ok.passed, (ok.differences, ok.examples)
    assert ok.totals["suspects"] == 1 and ok.totals["settled"] == 1


def regions(table: str) -> str:
    """``{region}#{shard}``: 4 random -> hash(customer) % 8, one logical partition per region."""
    return gsi_migration("gsi-region", table, old_shards=4, new_shards=8, old_partition="{region}#{shard}",
                         new_partition="{region}#{shard}")


def test_each_logical_partition_the_scan_saw_is_read_and_the_read_only_verify_joins_too(dynalite, unique_name):
    """``{region}#{shard}``: the index side reads the 8 [to] values of each region the scan
    recorded (two here); ``verify --no-record`` (no lease, nothing written) runs the same join."""
    table = unique_name
    create_gsi_table(dynalite, table, partition_type="S")
    m, store = setup_index_migration(dynalite, table, table + "-ctl", regions(table), mid="gsi-region")
    for i in range(8):
        region = ("EU", "US")[i % 2]
        dynalite.call("put_item", TableName=table, Item=dict(header(i, 0), region={"S": region},
                                                               gsi_shard={"S": f"{region}#{i % 4}"}))
    assert operations.run_data_job("backfill", dynalite, store, m.id, JobOptions(**OPTS)).done
    ok = operations.verify_read_only(dynalite, store, m.id, JobOptions(**OPTS))
    assert ok.passed and ok.totals["index_queries"] == 16 and ok.totals["index_entries"] == 8, ok.totals

    _stub_index(dynalite, _drop_victim)
    failed = operations.verify_read_only(dynalite, store, m.id, JobOptions(**OPTS))
    assert not failed.passed and failed.differences["gsi_missing"] == 1
    assert failed.examples[0]["kind"] == "gsi_missing" and "121215" in failed.examples[0]["old_key"]


@pytest.mark.parametrize("window, lagged", [(0.0, False), (0.5, True)], ids=["no-window", "window"])
def test_an_index_entry_that_lags_is_reported_only_if_it_stays_past_the_settle_window(shared, window, lagged):
    """The victim's entry is absent from the fan-out and from the first two re-check looks (a
    GSI lagging behind the table), then back. With no settle window two equal looks report it;
    with a window longer than those looks it is seen again in time: settled, the run passes."""
    client, store, m = shared
    targeted = []

    def lag(kw, items):
        if "FilterExpression" in kw:
            targeted.append(kw)
            if len(targeted) > 2:
                return items  # caught up
        return _drop_victim(kw, items)

    _stub_index(client, lag)
    result = _look(client, store, m, settle_seconds=window)
    assert result.totals["suspects"] == 1
    if lagged:
        assert result.passed and result.totals["settled"] == 1 and len(targeted) == 3
    else:
        assert not result.passed and result.differences["gsi_missing"] == 1 and len(targeted) == 2
