"""Index-only migrations on dynalite: the in-place GSI rewrite, its races, verify, abort.

The forced interleavings run the rewrite's page and do the racing
write from a botocore ``before-send`` hook on that client's first UpdateItem: after the
page was scanned and the update built, before it reaches the server. Each also runs
once against a *mutant* whose UpdateItem carries no condition, and asserts the harm the
condition prevents happens there: the race test can fail.
"""

from __future__ import annotations

import random

import pytest

from reshard import operations
from reshard.aws.dynamo import Dynamo
from reshard.control.runs import unmappable_items
from reshard.control.transition import transition
from reshard.core.index import IndexMapper
from reshard.core.layout import hash_shard
from reshard.core.phases import Action
from reshard.core.versions import VersionClock
from reshard.jobs.budget import CapacityBudget
from reshard.jobs.index_jobs import IndexRewrite
from reshard.jobs.runner import JobOptions

from tests.index_support import create_gsi_table, header, setup_index_migration


class _Ctx:
    """What the page needs of a PageContext: its segment, and the guard before each write."""

    segment, total_segments = 0, 1

    def write_guard(self) -> None:
        pass


def _get(dynamo, table: str, i: int) -> dict | None:
    return dynamo.call("get_item", TableName=table, Key={"PK": {"S": f"InvoiceNumber#{121212 + i}"},
                                                          "SK": {"S": "root"}}, ConsistentRead=True).get("Item")


def _new_shard(customer: str) -> str:
    return str(hash_shard(customer, 16, "sha256"))


def _unconditioned(dynamo: Dynamo) -> None:
    """The mutant: the rewrite's UpdateItem without its ConditionExpression."""
    call = dynamo.call

    def mutant(op, **kw):
        if op == "update_item":
            kw.pop("ConditionExpression")
            used = kw["UpdateExpression"]
            kw["ExpressionAttributeNames"] = {k: v for k, v in kw["ExpressionAttributeNames"].items() if k in used}
            kw["ExpressionAttributeValues"] = {k: v for k, v in kw["ExpressionAttributeValues"].items() if k in used}
        return call(op, **kw)

    dynamo.call = mutant


def _race(dynalite, unique_name, racing, mutant: bool, state: dict | None = None):
    """Seed one pre-migration header, scan it, run ``racing`` just before the rewrite's UpdateItem."""
    table = unique_name
    create_gsi_table(dynalite, table)
    m, store = setup_index_migration(dynalite, table, table + "-ctl")
    if state is not None:
        state["m"] = m
    dynalite.call("put_item", TableName=table, Item=header(0, shard=_first_not_new("c-0"), customer="c-0"))
    job = dynalite  # the racing write is sent from inside the hook, on the same client (a PutItem/DeleteItem)
    fired = []

    def before_send(**kwargs):
        if not fired:
            fired.append(True)
            racing()

    job.client.meta.events.register("before-send.dynamodb.UpdateItem", before_send)
    if mutant:
        _unconditioned(job)
    budget = CapacityBudget().attach(job, table)
    rewrite = IndexRewrite(job, store, m.id, "backfill", {"ByCountry": IndexMapper(m.indexes[0])}, m.keys, table,
                           budget, "new", {})
    counts, _ = rewrite.page(_Ctx(), None)
    assert fired, "the racing write never ran"
    if mutant:
        del job.call  # the fixture's client again, for the caller's reads
    return table, counts


def _first_not_new(customer: str) -> int:
    """An old shard (0..3) that is not the item's new value, so the rewrite has work to do."""
    return next(s for s in range(4) if str(s) != _new_shard(customer))


@pytest.mark.parametrize("mutant", [False, True], ids=["fenced", "mutant-unconditioned"])
def test_a_shim_write_between_scan_and_update_stays(dynalite, unique_name, mutant):
    """A real shim (ShardedTable, backfill phase: it writes the new GSI value) re-puts the invoice
    with another customer after the rewrite scanned it.

    Its value is hash(new customer); the rewrite computed hash(old customer) from the scan.
    Fenced: the update fails its condition, the re-read finds the item at its new value
    (raced) and the shim's write stays whole. Mutant: the stale value overwrites the shim's,
    and the item sits under the wrong GSI shard.
    """
    from reshard.core.phases import Phase
    from tests.shim_helpers import shim

    assert _new_shard("c-moved") != _new_shard("c-0")  # the two values differ: a stale write is visible
    state = {}

    def racing():
        m = state["m"]
        t = shim(m, dynalite, phase=Phase.BACKFILL)
        t.put_item(Item={"PK": "InvoiceNumber#121212", "SK": "root", "tx_country": "USA", "customer": "c-moved",
                         "amount": 555, "gsi_shard": 0})
        state["shim"] = t

    table, counts = _race(dynalite, unique_name, racing, mutant, state)
    state["shim"].close()
    got = _get(dynalite, table, 0)
    if mutant:
        assert got["gsi_shard"] == {"N": _new_shard("c-0")}  # the harm the condition prevents
        return
    assert counts["raced"] == 1 and counts["moved"] == 0
    assert got["gsi_shard"] == {"N": _new_shard("c-moved")} and got["amount"] == {"N": "555"}
    assert got["customer"] == {"S": "c-moved"} and "_rs_v" in got


@pytest.mark.parametrize("mutant", [False, True], ids=["fenced", "mutant-unconditioned"])
def test_a_delete_between_scan_and_update_is_not_resurrected(dynalite, unique_name, mutant):
    """The item is deleted after the scan: UpdateItem would upsert it; the condition keeps it deleted."""
    key = {"PK": {"S": "InvoiceNumber#121212"}, "SK": {"S": "root"}}
    table, counts = _race(dynalite, unique_name,
                          lambda: dynalite.call("delete_item", TableName=unique_name, Key=key), mutant)
    got = _get(dynalite, table, 0)
    if mutant:
        assert got is not None and set(got) == {"PK", "SK", "gsi_shard"}  # resurrected as a key-only husk
        return
    assert counts["raced"] == 1
    assert got is None


def test_a_write_of_other_attributes_between_scan_and_update_is_rewritten_again(dynalite, unique_name):
    """A shim UpdateItem of ``amount`` (new ``_rs_v``, GSI value untouched) after the scan: the
    condition fails, the item is re-read, and rewritten under its new version; the write stays."""
    version = VersionClock("shim").next()
    key = {"PK": {"S": "InvoiceNumber#121212"}, "SK": {"S": "root"}}

    def racing():
        dynalite.call("update_item", TableName=unique_name, Key=key, UpdateExpression="SET amount = :a, #v = :v",
                      ExpressionAttributeNames={"#v": "_rs_v"},
                      ExpressionAttributeValues={":a": {"N": "777"}, ":v": {"S": version}})

    table, counts = _race(dynalite, unique_name, racing, mutant=False)
    got = _get(dynalite, table, 0)
    assert counts["moved"] == 1 and counts["raced"] == 0
    assert got["amount"] == {"N": "777"} and got["_rs_v"] == {"S": version}
    assert got["gsi_shard"] == {"N": _new_shard("c-0")}


def test_backfill_verify_repair_and_abort(dynalite, unique_name):
    """The rewrite through run_data_job: counts, versions kept; verify finds and repairs a stray
    value; an abort's cleanup rewrites every item back to an old value and retires."""
    table = unique_name
    create_gsi_table(dynalite, table)
    m, store = setup_index_migration(dynalite, table, table + "-ctl")
    rng = random.Random(3)
    for i in range(20):
        dynalite.call("put_item", TableName=table, Item=header(i, shard=rng.randrange(4)))
    versioned = dict(header(20, shard=1), _rs_v={"S": VersionClock("shim").next()})
    dynalite.call("put_item", TableName=table, Item=versioned)
    line = {"PK": {"S": "InvoiceNumber#121212"}, "SK": {"S": "line#1"}, "amount": {"N": "5"}}
    dynalite.call("put_item", TableName=table, Item=line)
    assert _new_shard("c-21") != "9"
    dynalite.call("put_item", TableName=table, Item=header(21, shard=9))  # neither layout: unmappable
    opts = JobOptions(segments=1, lease_seconds=15)

    result = operations.run_data_job("backfill", dynalite, store, m.id, opts)
    t = result.counts
    assert t["scanned"] == 23 and t["not_indexed"] == 1 and t["unmappable"] == 1 and t["raced"] == 0
    assert t["moved"] + t["already"] == 21
    assert [u["reason"] for u in unmappable_items(store, m.id)] == ["off-layout"]
    mapper = IndexMapper(m.indexes[0])
    for i in range(21):
        item = _get(dynalite, table, i)
        assert mapper.is_at(item, "new"), i
    assert _get(dynalite, table, 20)["_rs_v"] == versioned["_rs_v"]  # the version is kept
    assert _get(dynalite, table, 0).get("_rs_v") is None

    # The off-layout item needs an allowance; a bypassing writer puts another item off its new value.
    store.set_allowance(m.id, 1)
    dynalite.call("put_item", TableName=table, Item=header(7, shard=_first_not_new("c-7")))
    failed = operations.run_data_job("verify", dynalite, store, m.id, opts)
    assert not failed.passed and failed.differences["gsi_value"] == 1 and failed.differences["unmappable"] == 1
    assert failed.examples and failed.examples[0]["kind"] == "gsi_value"
    repaired = operations.run_data_job("verify", dynalite, store, m.id, JobOptions(segments=1, lease_seconds=15,
                                                                                    repair=True))
    assert repaired.repaired == 1
    ok = operations.run_data_job("verify", dynalite, store, m.id, opts)
    assert ok.passed and ok.checked == 22 and ok.differences["gsi_missing"] == 0
    # The fan-out over the 16 [to] values read every header (the off-layout one sits at 9, a [to] value too).
    assert ok.totals["index_queries"] == 16 and ok.totals["index_entries"] == 22 and ok.totals["index_rcu"] > 0

    transition(store, m.id, Action.ABORT, allow_no_shims=True)
    cleaned = operations.run_data_job("cleanup", dynalite, store, m.id, opts)
    assert cleaned.finished and store.load_state(m.id).retired
    for i in range(21):
        assert mapper.is_at(_get(dynalite, table, i), "old"), i
    assert _get(dynalite, table, 20)["_rs_v"] == versioned["_rs_v"]


def test_the_switch_guards_the_written_value_and_rollback_to_planned_is_refused(dynalite, unique_name):
    """dual_write -> dual_read changes the value shims write: it goes through the switch (a
    "switch" history row); backfill -> cutover changes no write of an index-only migration:
    no switch. Rollback dual_write -> planned is refused (planned reads only old values)."""
    from reshard import errors

    table = unique_name
    create_gsi_table(dynalite, table)
    m, store = setup_index_migration(dynalite, table, table + "-ctl", phases=1)  # dual_write
    with pytest.raises(errors.RefusedTransition, match="rollback to planned is refused for a sharded-index"):
        transition(store, m.id, Action.ROLLBACK, allow_no_shims=True)
    _, after = transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    assert after.phase.value == "dual_read" and after.last.action == "switch"
    transition(store, m.id, Action.ADVANCE, allow_no_shims=True)  # backfill
    assert operations.run_data_job("backfill", dynalite, store, m.id, JobOptions(segments=1, lease_seconds=15)).done
    assert operations.run_data_job("verify", dynalite, store, m.id, JobOptions(segments=1, lease_seconds=15)).passed
    _, after = transition(store, m.id, Action.ADVANCE, allow_no_shims=True)
    assert after.phase.value == "cutover" and after.last.action == "advance"
    assert [h.action for h in store.history(m.id)].count("switch") == 1
