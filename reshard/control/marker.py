"""The operator's writes of the table marker (:mod:`reshard.core.marker`): ``start`` claims
it before registering the migration, a retire gives it back, ``doctor`` checks whom it names.

Every write is conditional on the marker the writer read (or on there being none), so two
operators never both believe they own the table's marker, and a retire never takes the
marker from a migration that claimed it since.
"""

from __future__ import annotations

from reshard import errors
from reshard.aws.dynamo import Dynamo
from reshard.control.records import MigrationState
from reshard.control.store import ControlStore, landed
from reshard.core.deadlines import MAX_HORIZON_SECONDS
from reshard.core.marker import CONTROL_ATTR, MARKER_ATTR, Owner, marker_item, marker_key, owner_of
from reshard.core.wire import S


def key_for(desc: dict) -> dict:
    """The marker's key in a table, from its DescribeTable answer (``Table`` or the answer)."""
    t = desc.get("Table", desc)
    types = {a["AttributeName"]: a["AttributeType"] for a in t.get("AttributeDefinitions", [])}
    hash_ = next(k["AttributeName"] for k in t["KeySchema"] if k["KeyType"] == "HASH")
    range_ = next((k["AttributeName"] for k in t["KeySchema"] if k["KeyType"] == "RANGE"), None)
    return marker_key(hash_, types.get(hash_, "S"), range_, types.get(range_, "S") if range_ else None)


def read(dynamo: Dynamo, table: str, key: dict) -> dict | None:
    """The marker item as it is now (a consistent read), or None."""
    return dynamo.call("get_item", TableName=table, Key=key, ConsistentRead=True).get("Item")


def _as_written(item: dict | None) -> dict:
    """The condition that the marker is still exactly the one read (or still absent)."""
    if item is None or MARKER_ATTR not in item:
        return {"ConditionExpression": "attribute_not_exists(#m)", "ExpressionAttributeNames": {"#m": MARKER_ATTR}}
    return {"ConditionExpression": "#m = :m AND #c = :c",
            "ExpressionAttributeNames": {"#m": MARKER_ATTR, "#c": CONTROL_ATTR},
            "ExpressionAttributeValues": {":m": item[MARKER_ATTR], ":c": item.get(CONTROL_ATTR, S(""))}}


def owner_state(store: ControlStore, owner: Owner) -> MigrationState | None:
    """The migration a marker names, read from the control table it names (None: unknown there,
    or that control table does not exist)."""
    other = store if owner.control_table == store.table else ControlStore(store.dynamo, owner.control_table)
    try:
        return other.load_state(owner.migration_id, missing_ok=True)
    except errors.ResourceNotFound:
        return None
    except errors.MigrationNotFound:  # ControlTableMissing
        return None


def previous_horizon(store: ControlStore, mine: Owner) -> float:
    """The request horizon of the owner ``mine`` replaced (0 without one): its shims and jobs
    may still have requests in flight dated by it, so the new migration's ``planned`` lasts
    at least that long (r25's B6), whatever the new migration's own ``server_deadline`` (a25's
    finding 2: the next migration's ``--no-server-deadline`` must not end the previous owner's
    bound early). An owner without a server deadline recorded no bound to honour: 0. An owner
    whose row cannot be read: the longest horizon."""
    if mine.previous is None:
        return 0.0
    st = owner_state(store, mine.previous)
    if st is None:
        return MAX_HORIZON_SECONDS
    return st.request_horizon if st.server_deadline else 0.0


def claim(dynamo: Dynamo, store: ControlStore, migration_id: str, table: str, desc: dict) -> Owner:
    """Make the table's marker name ``migration_id`` (in ``store``'s control table), keeping
    the owner it replaces as the previous one. Idempotent. Refuses (BadInput) a marker whose
    migration is still active; ConcurrentChange if another operator wrote it meanwhile."""
    key = key_for(desc)
    item = read(dynamo, table, key)
    owner = owner_of(item)
    if owner is not None and owner.migration_id == migration_id and owner.control_table == store.table:
        return owner
    if owner is not None:
        st = owner_state(store, owner)
        if st is not None and st.active:
            raise errors.BadInput(f"start refused: table {table!r} is owned by {owner.text()}, which is in "
                                  f"{st.phase}: complete or abort it first (`reshard status {owner.migration_id} "
                                  f"--control-table {owner.control_table}`)")
    previous = Owner(owner.migration_id, owner.control_table) if owner is not None else None
    mine = Owner(migration_id, store.table, previous)
    wrote = marker_item(key, mine)
    try:
        dynamo.call("put_item", TableName=table, Item=wrote, **_as_written(item))
    except errors.ConditionalCheckFailed:
        if landed(dynamo, table, key, wrote):
            return mine  # ours, its answer lost (the resend failed on it): no orphan, no "another operator"
        raise errors.ConcurrentChange(f"another operator wrote the table marker of {table!r} at the same moment; "
                                      "check `reshard status` and retry") from None
    return mine


def give_back(dynamo: Dynamo, store: ControlStore, migration_id: str, table: str,
              desc: dict | None = None) -> str:
    """Put back the owner the marker had before ``migration_id`` claimed it (a retire, or a
    ``start`` that could not register), only while it still names ``migration_id``. Returns
    what happened, in words."""
    try:
        key = key_for(desc or dynamo.describe_table(table))
        item = read(dynamo, table, key)
    except (errors.ResourceNotFound, errors.TableProblem):  # describe_table says TableProblem
        return f"table {table!r} is gone (nothing to give back)"
    owner = owner_of(item)
    if owner is None or owner.migration_id != migration_id or owner.control_table != store.table:
        return "the marker does not name it (nothing to give back)"
    wrote = None if owner.previous is None else marker_item(key, owner.previous)
    done = "marker removed (no previous owner)" if wrote is None else f"marker given back to {owner.previous.text()}"
    try:
        if wrote is None:
            dynamo.call("delete_item", TableName=table, Key=key, **_as_written(item))
        else:
            dynamo.call("put_item", TableName=table, Item=wrote, **_as_written(item))
    except errors.ConditionalCheckFailed:
        if not landed(dynamo, table, key, wrote):  # ours landed, its answer lost: done all the same
            return "the marker changed meanwhile (left alone)"
    return done
