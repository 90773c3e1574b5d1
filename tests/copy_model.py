"""A stand-in for the backfill's copy step (the protocol described in reshard.jobs.backfill), reusable
by the backfill's own tests.

``copy_items`` copies scanned old-layout items to the new layout: unconditional write of
the re-keyed items -> consistent read-back of the sources -> ``versions.copy_action`` ->
a fenced recopy or a conditional undo. ``hook`` (optional) is called between the steps
so a test can interleave other work exactly there.
"""

from __future__ import annotations

from typing import Callable

from reshard.core.layout import VERSION_ATTR, KeyMapper
from reshard.core.wire import key_of
from reshard.core.versions import copy_action, fence_for, version_of
from reshard import errors


def copy_items(dynamo, table: str, mapper: KeyMapper, scanned: list[dict],
               hook: Callable[[str], None] = lambda step: None) -> dict:
    counts = {"copied": 0, "recopied": 0, "undone": 0, "unmoved": 0}
    moving = []
    for item in scanned:
        new_item, moved = mapper.remap(item)
        if moved:
            moving.append((item, new_item))
        else:
            counts["unmoved"] += 1
    if not moving:
        return counts
    # Unconditional: a shim write this overwrites in the new layout already changed the
    # old (authoritative) item, which the read-back below sees.
    dynamo.batch_write(table, [{"PutRequest": {"Item": new}} for _, new in moving])
    counts["copied"] += len(moving)
    hook("written")
    keys = [key_of(old, mapper.old.key_attrs) for old, _ in moving]
    current = {_k(i, mapper): i for i in dynamo.batch_get(table, keys, consistent=True)}
    hook("read-back")
    for old, new in moving:
        action = copy_action(old, current.get(_k(old, mapper)))
        if action.kind == "recopy":
            again, _ = mapper.remap(action.item)
            fence = fence_for(version_of(action.item))
            try:
                dynamo.call("put_item", TableName=table, Item=again, ConditionExpression=fence.expression,
                            ExpressionAttributeNames=fence.names, **_values(fence.values))
                counts["recopied"] += 1
            except errors.ConditionalCheckFailed:
                pass  # a newer shim write is in the new layout already
        elif action.kind == "undo":
            v = version_of(old)
            cond = ("#rs_v = :rs_v", {":rs_v": {"S": v}}) if v else ("attribute_not_exists(#rs_v)", {})
            try:
                dynamo.call("delete_item", TableName=table, Key={a: new[a] for a in mapper.new.key_attrs},
                            ConditionExpression=cond[0], ExpressionAttributeNames={"#rs_v": VERSION_ATTR},
                            **_values(cond[1]))
                counts["undone"] += 1
            except errors.ConditionalCheckFailed:
                pass  # no longer our copy: a shim write replaced it
    return counts


def _k(item: dict, mapper: KeyMapper) -> str:
    return repr(sorted(key_of(item, mapper.old.key_attrs).items()))


def _values(v: dict) -> dict:
    return {"ExpressionAttributeValues": v} if v else {}
