"""Issue 25 for an index-only migration (``[index.NAME]`` alone: items keep their keys, only a
GSI attribute is rewritten): a delete leaves a versioned tombstone at the item's own key, as in a
table migration, and ``reshard cleanup`` (in ``cleanup`` and ``aborted``) and
``--strip-bookkeeping`` delete it only ``H + 2`` s after the scan answer that saw it.

Before, an index-only shim deleted with a plain DeleteItem in every phase: a put's held first
attempt (the network kept it; the shim's retry was acknowledged) delivered after a later
acknowledged delete found an empty key, passed its fence (``attribute_not_exists(_rs_v) OR
_rs_v < :v``) and the deleted item came back (guarantee 2, via 5b).

Forced interleavings on dynalite behind the fidelity proxy (server deadline enforced), shaped as
``test_late_writes_tombstones.py`` (the table case).
"""

from __future__ import annotations

import pytest

from reshard.aws.fidelity import FidelityProxy
from reshard.control.records import META
from reshard.core.layout import is_tombstone
from reshard.core.phases import Phase
from reshard.jobs.cleanup import CLEANUP
from reshard.jobs.index_jobs import index_spec
from reshard.jobs.runner import JobOptions, run_job
from reshard.jobs.strip import STRIP
from reshard.shim.table import ShardedTable
from tests.index_support import create_gsi_table, gsi_migration, setup_index_migration
from tests.late_support import client

pytestmark = pytest.mark.integration

#: The request horizon: the jobs' hold per page with a tombstone is H + 2 s of real time; a
#: request signed when the shims started is still inside it after a job that did not hold.
H_JOB = 8.0


@pytest.fixture
def proxy(dynalite_server):
    with FidelityProxy(dynalite_server.endpoint) as p:
        yield p


class IndexRun:
    """An index-only migration on dynalite behind the proxy, its phases moved by the control store."""

    def __init__(self, proxy, name: str):
        from reshard.control import marker as markers
        self.proxy, self.dynamo = proxy, client(proxy.endpoint)
        self.table, self.control = name, f"{name}-ctl"
        create_gsi_table(self.dynamo, self.table)
        self.migration, self.store = setup_index_migration(self.dynamo, self.table, self.control,
                                                           gsi_migration("gsi-late", self.table), phases=0)
        # As `start` does: the table's marker names the migration; the server deadline is enforced.
        markers.claim(self.dynamo, self.store, self.migration.id, self.table, self.dynamo.describe_table(self.table))
        self.store.update(self.store.mpk(self.migration.id), META, "SET request_horizon = :h, server_deadline = :e",
                          values={":h": {"N": str(H_JOB)}, ":e": {"S": "enforced"}})
        self.proxy.advance_clock(H_JOB + 2)

    def move(self, *phases: str) -> None:
        """Each a compare-and-set of the phase, then H + 2 s of server time (docs/late-writes.md, 2)."""
        for p in phases:
            self.store.set_phase(self.store.load_state(self.migration.id), Phase(p), "test", "test")
            self.proxy.advance_clock(H_JOB + 2)

    def shim(self) -> ShardedTable:
        return ShardedTable(self.migration, client(self.proxy.endpoint), control_table=self.control,
                            refresh_seconds=3600)

    def stored(self, key: dict) -> dict | None:
        return self.dynamo.call("get_item", TableName=self.table, Key=key, ConsistentRead=True).get("Item")


ITEM = {"PK": "InvoiceNumber#7", "SK": "root", "tx_country": "USA", "customer": "c-7", "amount": 100}
KEY = {"PK": "InvoiceNumber#7", "SK": "root"}
WIRE_KEY = {"PK": {"S": "InvoiceNumber#7"}, "SK": {"S": "root"}}


def _held_put_then_delete(run: IndexRun, a, b) -> str:
    """A's put: its first attempt is held by the network (A's connection closed), A's retry lands
    and is acknowledged; then B deletes the item (acknowledged). Returns the held attempt's handle."""
    rule = run.proxy.hold(op="PutItem", table=run.table, key=KEY, mode="lose", times=1)
    a.put_item(Item=ITEM)
    (held,) = run.proxy.held(rule=rule)
    assert a.get_item(Key=KEY, ConsistentRead=True)["Item"]["amount"] == 100, "A's retry landed"
    b.delete_item(Key=KEY)
    assert b.get_item(Key=KEY, ConsistentRead=True).get("Item") is None
    return held["handle"]


def _the_item_stays_deleted(run: IndexRun, b, handle: str, refused: tuple[str, ...]) -> None:
    outcome = run.proxy.release(handle)
    got = b.get_item(Key=KEY, ConsistentRead=True).get("Item")
    assert got is None, f"the item B deleted came back: A's held first attempt landed ({outcome['status']}): {got}"
    stored = run.stored(WIRE_KEY)
    assert stored is None or is_tombstone(stored), stored
    assert outcome["status"] == 400 and outcome["code"] in refused, outcome


@pytest.mark.parametrize("phase", ["dual_write", "cleanup", "complete"])
def test_an_index_only_delete_outlasts_a_held_put(proxy, unique_name, phase):
    """B's delete leaves a tombstone newer than A's held attempt: delivered within its horizon,
    the attempt fails its version fence and the item stays deleted (a plain delete left an
    empty key that the fence passed)."""
    run = IndexRun(proxy, unique_name)
    run.move(*{"dual_write": ["dual_write"], "cleanup": ["dual_write", "dual_read", "backfill", "cutover", "cleanup"],
               "complete": ["dual_write", "dual_read", "backfill", "cutover", "cleanup", "complete"]}[phase])
    a, b = run.shim(), run.shim()
    try:
        assert a.phase == phase and b.phase == phase
        handle = _held_put_then_delete(run, a, b)
        assert is_tombstone(run.stored(WIRE_KEY)), "B's delete left a tombstone at the item's own key"
        _the_item_stays_deleted(run, b, handle, ("ConditionalCheckFailedException",))
        # Readers treat the tombstone as absent: a query, a scan and the GSI's query see nothing.
        assert b.query(Key={"PK": "InvoiceNumber#7"})["Items"] == []
        assert b.scan()["Items"] == []
        assert b.query(IndexName="ByCountry", Key={"tx_country": "USA"}).get("Items") == []
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("job", ["cleanup", "aborted", "strip"])
def test_an_index_only_tombstone_is_deleted_only_once_a_held_put_cannot_land(proxy, unique_name, job):
    """The same with the job that removes the tombstone between B's delete and the delivery:
    ``reshard cleanup`` in ``cleanup`` and in ``aborted`` (whose shims write tombstones too), and
    ``--strip-bookkeeping`` in ``complete``. Deleted as soon as scanned, the tombstone leaves an
    empty key that the held attempt's fence passes; each job holds a page with a tombstone
    ``H + 2`` s after its scan answer, and the attempt, signed under a fact older than that
    answer, has expired by then."""
    run = IndexRun(proxy, unique_name)
    path = {"cleanup": ["dual_write", "dual_read", "backfill", "cutover", "cleanup"],
            "aborted": ["dual_write", "aborted"],
            "strip": ["dual_write", "dual_read", "backfill", "cutover", "cleanup", "complete"]}[job]
    run.move(*path)
    a, b = run.shim(), run.shim()
    try:
        assert a.phase == b.phase == path[-1]
        handle = _held_put_then_delete(run, a, b)
        opts = JobOptions(segments=1, workers=1, page_size=50)
        result = run_job(STRIP if job == "strip" else index_spec(CLEANUP), run.dynamo, run.store, run.migration.id,
                         opts)
        _the_item_stays_deleted(run, b, handle, ("InvalidSignatureException",))
        counter = "tombstones_deleted" if job == "strip" else "tombstones_retired"
        assert result.done and result.counts[counter] == 1, result.counts
        assert run.stored(WIRE_KEY) is None, "the job deleted the tombstone"
        if job == "aborted":
            assert run.store.load_state(run.migration.id).retired
    finally:
        a.close()
        b.close()


def test_an_index_only_duplicate_after_another_writers_put_was_fenced_already(proxy, unique_name):
    """The sibling case needed no change (a check, passing before the tombstones too): A's put
    lands (acknowledged) and the network keeps a copy; B's later put lands (acknowledged). The
    copy, delivered within its horizon, fails its version fence (index-only writes are fenced in
    every phase of a registered migration): B's write stays."""
    run = IndexRun(proxy, unique_name)
    run.move("dual_write", "dual_read", "backfill", "cutover", "cleanup")
    a, b = run.shim(), run.shim()
    try:
        rule = run.proxy.duplicate(op="PutItem", table=run.table, key=KEY, copy="hold")
        a.put_item(Item=ITEM)
        (copy,) = run.proxy.held(rule=rule)
        b.put_item(Item={**ITEM, "amount": 200})
        outcome = run.proxy.release(copy["handle"])
        assert b.get_item(Key=KEY, ConsistentRead=True)["Item"]["amount"] == 200, outcome
        assert outcome["status"] == 400 and outcome["code"] == "ConditionalCheckFailedException", outcome
    finally:
        a.close()
        b.close()
