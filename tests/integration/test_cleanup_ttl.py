"""Cleanup's TTL marking against a write that lands between the pass's scan and its write, on
dynalite.

The marking is conditioned on the version scanned: a lagging cutover shim's mirror write of
the old copy (stamped with a newer version) that lands in between must survive with its
content and no TTL (``changed_meanwhile``), for an item that was unversioned when scanned
(pre-migration) and for one a shim had written. (Fails with the version fence left out of
the condition.)
"""

from __future__ import annotations

import dataclasses

from reshard.aws.dynamo import Dynamo, RetryPolicy
from reshard.control.transition import transition
from reshard.core.layout import VERSION_ATTR
from reshard.core.phases import Action
from reshard.core.versions import VersionClock, fence_for
from reshard.core.wire import key_of
from reshard.jobs.backfill import BACKFILL
from reshard.jobs.cleanup import CLEANUP
from reshard.jobs.runner import JobOptions, run_job
from reshard.jobs.verify import VERIFY

from tests.backfill_support import key_str, logical, scan_all, setup_migration

#: dynalite has no UpdateTimeToLive: the pass's check of the table's TTL setting is skipped.
CLEANUP_ON_DYNALITE = dataclasses.replace(CLEANUP, prepare=lambda ctx: None)
OPTS = dict(segments=1, workers=1, lease_seconds=30, concurrency=1)


def test_a_mirror_write_between_the_scan_and_the_ttl_marking_survives(dynalite_server, dynalite, unique_name):
    m, mapper, store = setup_migration(dynalite, "sensor", unique_name, control=unique_name + "-c")
    clock = VersionClock("shim-a")
    olds = []
    moving = (mapper.to_physical(logical("sensor", i), mapper.old) for i in range(40))
    for item in [i for i in moving if mapper.new.key(mapper.fields(i, mapper.old)) != key_of(i, ["PK", "SK"])][:2]:
        if olds:  # the second one was written through a shim before the backfill: versioned
            item[VERSION_ATTR] = {"S": clock.next()}
        dynalite.call("put_item", TableName=m.table, Item=item)
        olds.append(item)
    assert run_job(BACKFILL, dynalite, store, m.id, JobOptions(**OPTS)).done
    assert run_job(VERIFY, dynalite, store, m.id, JobOptions(**OPTS)).passed
    transition(store, m.id, Action.ADVANCE, allow_no_shims=True)  # -> cutover (no shims: acknowledged at once)
    assert run_job(VERIFY, dynalite, store, m.id, JobOptions(**OPTS)).passed  # the catch-up verify
    transition(store, m.id, Action.ADVANCE, allow_no_shims=True)  # -> cleanup

    # The pass's own client: before its first TTL write is sent, the "lagging shim" writes both items.
    worker = Dynamo(endpoint_url=dynalite_server.endpoint, region="us-east-1",
                    retry=RetryPolicy(max_attempts=3, base_seconds=0.01), connect_timeout=1, read_timeout=4)
    mirrored = {}

    def lagging_mirror(request, **_):
        if b'"expires_at"' not in request.body or mirrored:
            return None
        for item in olds:  # as a cutover shim's mirror write: a newer version, new content, fenced
            version = clock.next()
            newer = {**item, "temp": {"N": "99"}, VERSION_ATTR: {"S": version}}
            fence = fence_for(version)
            dynalite.call("put_item", TableName=m.table, Item=newer, ConditionExpression=fence.expression,
                          ExpressionAttributeNames=fence.names, ExpressionAttributeValues=fence.values)
            mirrored[key_str(item)] = newer
        return None

    worker.client.meta.events.register("before-send.dynamodb.UpdateItem", lagging_mirror)
    result = run_job(CLEANUP_ON_DYNALITE, worker, store, m.id, JobOptions(**OPTS))
    assert result.done and len(mirrored) == 2
    assert result.totals["changed_meanwhile"] == 2 and result.totals.get("expiring", 0) == 0, result.totals
    left = scan_all(dynalite, m.table)
    for key, newer in mirrored.items():
        assert left[key] == newer  # the mirror write's content, and no TTL
