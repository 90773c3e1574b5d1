"""The write protocol: what a put, update, delete or batch of them writes, in which order,
under which condition -- the rules the model checker (``tests/model``) explores.

Writes (put, update, delete)
    The authoritative layout is written first, then the other layout gets the full
    resulting item (:meth:`WriteProtocol._mirror_to`). Every write of a registered
    migration stamps ``_rs_v`` (a :class:`~reshard.core.versions.VersionClock` version, one
    clock per ShardedTable). In every phase of a registered migration (all are fenced:
    ``core/phases.ROUTING``) both writes carry the fence
    ``attribute_not_exists(_rs_v) OR _rs_v < :v``: versions only grow on each copy, so both
    layouts converge to the newest write, also when two instances on adjacent phases
    (``backfill`` / ``cutover``) have different authoritative layouts. A fenced
    authoritative write that fails is told apart from the application's own condition by
    one consistent read (:meth:`WriteProtocol._authoritative`): a stored version >= ours is
    a fence loss (observe it, retry above it, bounded by :data:`MAX_FENCE_RETRIES`), an
    older one means the application's ConditionExpression failed. A failed mirror write
    means a newer write is already there: fine. Which keys are written, and which copy is
    marked, is routing (``routing.py``). No TransactWriteItems: one plain write per layout
    per app write.

Deletes
    In ``routing.tombstones`` phases (every phase of a registered migration) a delete
    writes a tombstone (physical key, the logical key fields, ``_rs_v``, ``_rs_del``)
    fenced to every layout, so neither a racing backfill copy, a lagging mirror write nor
    a late request (a duplicate, a held first attempt) can bring the item back; reads
    treat a tombstone as absent; ``reshard cleanup`` (and strip, in ``complete``) delete
    them ``H + 2`` s after a scan saw them. Elsewhere (the steady state, an index-only
    migration's single layout) a delete is a plain DeleteItem.

Tombstones and the application's conditions
    A tombstone stores the logical key fields (the backfill must be able to re-key it),
    yet the application must see an absent item. Its ConditionExpression is rewritten
    (``expr.tombstone_aware``): what the condition means on an absent item is a constant
    computed from its text (every path is missing there), so the server decides with
    ``attribute_exists(_rs_del) OR (cond)`` (constant true) or
    ``attribute_not_exists(_rs_del) AND (cond)`` (constant false) -- no extra request.
    Parts over values alone (``:a = :b``) and over key fields are decided first from the
    request (``expr.decide_key_fields``, ``app_expressions.AppExpressions._decided``), so the
    constant is always known for those. Every update, in every phase, removes ``_rs_del``: a leftover
    tombstone never hides an acknowledged update.

Late writes (docs/late-writes.md)
    A write retried after a lost answer recognises its own landed attempt
    (``_authoritative``: a :class:`_Landed`). While the control row's ``newer_may_be`` is
    set, each write first catches the authoritative copy up (:meth:`WriteProtocol._catch_up`).
    No update, and no application condition, acts on a copy a cleanup retired (``_rs_gone``),
    in any phase, the steady state too (``_authoritative``, ``_remove_retired``).

Sharded GSIs (``[index.NAME]`` migrations)
    Writes give the GSI attribute of items in the index the value of the layout the phase
    writes (a put: computed, :meth:`WriteProtocol._with_index_values`; an update of a field
    the value is computed from: in the same UpdateItem, ``shim/index_values.index_actions``; any
    other update: from its result, by one more conditional UpdateItem when it differs,
    :meth:`WriteProtocol._fix_index_values`). A migration that also re-keys the table gives
    every copy it writes the phase's value (a mirror too).

Sizes
    A put is checked against 400 KB in every layout it writes (the new copy is larger:
    the marker, the version, maybe a longer key) *before* the authoritative write, and
    refused with a ``ValidationException`` (:class:`ItemTooLarge`, also a botocore
    ``ClientError``). An update's result is not known in advance: an update that grows
    an item past the limit in the mirror layout only still fails after the authoritative
    write (a known limit).

What a write answers (``ReturnValues``) is shaped by ``returns.py``; the app's
expressions arrive as text from ``app_expressions.py``. A mixin of
:class:`~reshard.shim.table.ShardedTable`; the module map is in ``reshard/shim/__init__.py``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

from reshard import errors
from reshard.aws.dynamo import RETRY_UNKNOWN, expression_kwargs
from reshard.core.decode import safe_text
from reshard.core.layout import (GONE_ATTR, MAX_ITEM_BYTES, NEW_COPY_ATTR, SOURCE_ATTR, TOMBSTONE_ATTR, VERSION_ATTR,
                                 is_retired, is_tombstone, item_size)
from reshard.core.versions import fence_for, newest, own_attempt, stored_version, unchanged, version_of
from reshard.core.wire import dump_key, still_as_read
from reshard.shim import metrics as shim_metrics
from reshard.shim.errors import ItemTooLarge, OldValuesUnknown, OutcomeUnknown
from reshard.shim.expr import TOMBSTONE_NAME, and_conditions, merge_update, tombstone_aware
from reshard.shim.index_values import (IndexUpdate, index_actions, index_update_plan, read_changed, update_effect,
                                       write_value)
from reshard.shim.phase_cache import PhaseState
from reshard.shim.requests import _late
from reshard.shim.routing import index_routing

log = logging.getLogger("reshard.shim")

#: How often a fenced authoritative write may lose to a newer version before giving up.
MAX_FENCE_RETRIES = 5

#: The guard of every update and every write with an application condition, in every phase:
#: a copy a cleanup retired (``_rs_gone``) is no item (``_authoritative``).
RETIRED_NAME = "#rs_gone"
NOT_RETIRED = f"attribute_not_exists({RETIRED_NAME})"


class _Landed(dict):
    """The outcome of an authoritative write whose answer was lost and whose retry met its own
    landed attempt: ``{"Attributes": the stored item}`` (what ALL_NEW would have returned)."""


def _key_text(key: Mapping[str, Any]) -> str:
    """A physical key as a message names it (``{"PK": "s-1#3", "SK": "..."}``)."""
    return safe_text(dump_key(key))


class WriteProtocol:
    """The write protocol of :class:`~reshard.shim.table.ShardedTable`: each app write's
    authoritative write, its mirror, their fences, retries and repairs."""

    # ------------------------------------------------------------------ the writes
    def _write_put(self, logical: dict, fields: dict, condition: str | None, app_names: dict, app_values: dict,
                   ReturnValues: str | None, on_failure: bool) -> dict:
        """``put_item``'s write: the item with its GSI values, caught up, put through every layout."""
        st = self._begin()
        try:
            logical = self._with_index_values(st, logical, fields)
            targets = self._write_keys(st, fields)
            self._catch_up(st, fields, targets)
            try:
                resp = self._put_through(st, targets, logical, condition, app_names, app_values,
                                         return_old=ReturnValues == "ALL_OLD", old_on_failure=on_failure)
            except errors.ConditionalCheckFailed as e:
                if on_failure and condition:
                    self._failed_item(e, targets[0][0], self.mapper.layout(st.routing.writes[0]))
                raise
        finally:
            self._end(st)
        return self._response(resp.get("Attributes") if ReturnValues == "ALL_OLD" else None,
                              self.mapper.layout(st.routing.writes[0]), resp, logical)

    def _write_delete(self, key_wire: dict, fields: dict, ConditionExpression: str | None, app_names: dict,
                      app_values: dict, want_old: bool, on_failure: bool) -> dict:
        """``delete_item``'s write: a tombstone put through every layout (an index-only migration's
        one: the item's own key); a plain DeleteItem only where nothing is versioned (the steady state)."""
        st = self._begin()
        try:
            targets = self._write_keys(st, fields)
            self._catch_up(st, fields, targets)
            keys = [k for k, _ in targets]
            if not st.routing.tombstones:
                # The steady state (boto3's semantics, by decision): a plain delete, with the
                # app's condition as DynamoDB would check it, on the authoritative key (the only
                # one here).
                old, first = None, {}
                condition, uses = tombstone_aware(ConditionExpression)  # a leftover tombstone is absent
                if uses:
                    app_names = {**app_names, TOMBSTONE_NAME: TOMBSTONE_ATTR}
                if condition:
                    # Judged on a retired copy the app's condition would see a deleted item: not
                    # there (below, as for a put or an update in _authoritative).
                    condition = and_conditions(condition, NOT_RETIRED)
                    app_names = {**app_names, RETIRED_NAME: GONE_ATTR}
                for i, key in enumerate(keys):
                    kwargs: dict[str, Any] = {"TableName": self.table, "Key": key}
                    if condition and i == 0:
                        kwargs["ConditionExpression"] = condition
                        kwargs["ExpressionAttributeNames"] = app_names
                        if app_values:
                            kwargs["ExpressionAttributeValues"] = app_values
                    if want_old and i == 0:
                        kwargs["ReturnValues"] = "ALL_OLD"
                    if on_failure and condition and i == 0:
                        kwargs["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
                    for _ in range(MAX_FENCE_RETRIES + 1):
                        # A conditional delete whose answer was lost is not sent again: its resend
                        # would fail on its own effect (r25b's B1); a read cannot tell "we deleted
                        # it" from "it was gone", so the app hears the outcome is unknown.
                        token = RETRY_UNKNOWN.set(False) if condition and i == 0 else None
                        try:
                            resp = self._call("delete_item", guard=self._phases.check_live if i == 0 else None,
                                              **kwargs)
                            break
                        except errors.ConditionalCheckFailed as e:
                            if condition and i == 0 and self._read_past_retired(key, e)[1]:
                                continue  # a retired copy (now deleted) failed it: the absent item decides
                            if on_failure:
                                self._failed_item(e, key, self.mapper.layout(st.routing.writes[0]))
                            raise
                        except errors.AWSError as e:
                            if getattr(e, "outcome_unknown", False):
                                raise OutcomeUnknown("DeleteItem") from e
                            raise
                        finally:
                            if token is not None:
                                RETRY_UNKNOWN.reset(token)
                    else:
                        raise errors.AWSError("delete_item", "ReshardVersionConflict",
                                              f"a retired copy at {_key_text(key)} kept failing the condition "
                                              f"{MAX_FENCE_RETRIES + 1} times; retry the request")
                    if i == 0:
                        old, first = resp.get("Attributes"), resp
                return self._response(old, self.mapper.layout(st.routing.writes[0]), first, key_wire)
            # Tombstone: key fields let the backfill re-key it; the version orders it.
            marker_base = {f: key_wire[f] for f in self._key_fields}
            try:
                resp = self._put_through(st, targets, marker_base, ConditionExpression, app_names, app_values,
                                         return_old=want_old, tombstone=True, old_on_failure=on_failure)
            except errors.ConditionalCheckFailed as e:
                if on_failure and ConditionExpression:
                    self._failed_item(e, targets[0][0], self.mapper.layout(st.routing.writes[0]))
                raise
        finally:
            self._end(st)
        return self._response(resp.get("Attributes") if want_old else None,
                              self.mapper.layout(st.routing.writes[0]), resp, key_wire)

    def _write_update(self, rv: str, key_wire: dict, fields: dict, UpdateExpression: str | None,
                      ConditionExpression: str | None, app_names: dict, app_values: dict,
                      clauses: Mapping[str, str], targets: list[str], on_failure: bool) -> dict:
        """``update_item``'s write: the app's UpdateExpression plus the shim's actions on the
        authoritative copy (fenced, GSI values set in the same request where it can), then the
        resulting item mirrored; its answer shaped by ``returns.py``."""
        # Our own actions: a complete item even when the update creates it.
        extra_set, our_names, our_values = [], {}, {}
        for i, f in enumerate(self._key_fields):
            if f in self._key_attrs:
                continue  # a key kept as is (identity template): the Key already writes it, SET may not
            our_names[f"#rs_k{i}"] = f
            our_values[f":rs_k{i}"] = key_wire[f]
            extra_set.append(f"#rs_k{i} = if_not_exists(#rs_k{i}, :rs_k{i})")
        st = self._begin()
        try:
            write_targets = self._write_keys(st, fields)
            self._catch_up(st, fields, write_targets)
            keys = [k for k, _ in write_targets]
            mirrors = write_targets[1:]
            # In every phase, steady included: an update of a tombstone revives the item.
            # A tombstone left behind (a lagging shim's delete, an aborted migration's
            # marker) would otherwise hide this acknowledged update for good.
            extra_remove = [TOMBSTONE_NAME]
            our_names[TOMBSTONE_NAME] = TOMBSTONE_ATTR
            our_names["#rs_new"] = NEW_COPY_ATTR
            if write_targets[0][1]:
                extra_set.append("#rs_new = :rs_new")
                our_values[":rs_new"] = {"S": self.migration.id}
            else:
                # The same as a put: an unmarked target (it is also the old copy) loses a
                # stale marker, so rollback and cleanup treat it as the old item it is.
                extra_remove.append("#rs_new")
            if st.stamps:
                extra_set.append("#rs_v = :rs_nv")
                our_names["#rs_v"] = VERSION_ATTR
            # The app's condition sees a tombstone as the absent item it stands for.
            app_condition, _ = tombstone_aware(ConditionExpression)
            internal_rv = rv
            need_result = bool(mirrors or self._indexes)
            if need_result and rv in ("NONE", "UPDATED_NEW"):
                # The mirror (and an index value) needs the whole new item: get it from the update itself.
                internal_rv = "ALL_NEW"
            plan = self._index_update_plan(st, clauses, app_names, key_wire)
            read: dict = {}
            for _ in range(MAX_FENCE_RETRIES + 1):
                sets, index_names, index_values, condition = [], {}, {}, app_condition
                if plan is not None:
                    # GSI values computed from the update's own operands and the fields read
                    # here, set in the same request (shim/index.py: index_actions).
                    read = self._read_for_index(keys[0], plan)
                    sets, index_names, index_values, ours, overrides = index_actions(
                        plan, read, key_wire, app_values, UpdateExpression or "", ConditionExpression,
                        self._identity_text(fields))
                    condition = and_conditions(app_condition, ours)
                    index_values.update(overrides)
                expression = merge_update(UpdateExpression, extra_set + sets, extra_remove)

                def attempt(version, condition, names, values, expression=expression,
                            added=(index_names, index_values)):
                    kwargs: dict[str, Any] = {"TableName": self.table, "Key": keys[0],
                                              "UpdateExpression": expression,
                                              "ExpressionAttributeNames": {**app_names, **our_names, **added[0],
                                                                           **names}}
                    vals = {**app_values, **our_values, **added[1], **values}
                    if version:
                        vals[":rs_nv"] = {"S": version}
                    if vals:  # DynamoDB refuses an empty map (a REMOVE-only update may have no values)
                        kwargs["ExpressionAttributeValues"] = vals
                    if condition:
                        kwargs["ConditionExpression"] = condition
                    if internal_rv != "NONE":
                        kwargs["ReturnValues"] = internal_rv
                    if on_failure and app_condition:
                        kwargs["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
                    return self._call("update_item", guard=self._phases.check_live, **kwargs)

                try:
                    _, resp = self._authoritative(st, keys[0], condition, attempt, update=True)
                    break
                except errors.ConditionalCheckFailed as e:
                    # Ours or the app's condition: without an app condition it was ours; with
                    # one, ours failed only if a field read has changed since.
                    if plan is None or not plan.reads or (
                            app_condition and not read_changed(plan, read, self._read_for_index(keys[0], plan))):
                        if on_failure and app_condition:
                            self._failed_item(e, keys[0], self.mapper.layout(st.routing.writes[0]))
                        raise
            else:
                raise errors.AWSError("write", "ReshardVersionConflict",
                                      f"the fields index values are computed from changed under the update of "
                                      f"{keys[0]} {MAX_FENCE_RETRIES + 1} times; retry the request")
            # Our own attempt already landed (its answer was lost): the stored item is our result.
            landed = isinstance(resp, _Landed)
            attrs = resp.get("Attributes")
            if need_result:
                if internal_rv == "ALL_NEW" or landed:
                    full = attrs
                else:
                    # The app asked for old values: read the result (one more read). A
                    # write landing in between is mirrored instead of ours; fine, it is
                    # newer and the mirror is fenced by its own version.
                    full = self._get(keys[0], True)[0]
                if full and self._indexes:
                    fixed = self._fix_index_values(st, keys[0], full)
                    if fixed and internal_rv == "ALL_NEW" and attrs:
                        attrs = {**attrs, **{a: v for a, v in fixed.items() if a in attrs}}
                if full and mirrors:  # None: the item was removed in between; nothing left to mirror
                    # Every copy gets the index value of the phase, as a put gives it.
                    self._mirror_to(mirrors, self._with_index_values(st, full, fields))
            if landed and rv in ("ALL_OLD", "UPDATED_OLD"):
                raise OldValuesUnknown("UpdateItem")  # after the mirror: the write is complete
        finally:
            self._end(st)
        return self._update_answer(rv, resp, attrs, targets, internal_rv, landed, clauses, app_names, key_wire)

    def _write_batch(self, ops: list[tuple[str, Mapping[str, Any]]]) -> None:
        """A ``batch_writer()`` flush: one BatchWriteItem in the steady state (with computable
        keys); in every phase of a registered migration each request as its own fenced put or
        tombstone.

        BatchWriteItem takes no condition, and a duplicated batch request (the fault model:
        any request may land twice, within its horizon) would land again after a later
        acknowledged write of the same item, or bring back an item deleted since: only
        where nothing is versioned (boto3's semantics, by decision) is it sent as one."""
        st = self._begin()
        try:
            layout = self.mapper.layout(st.routing.writes[0])
            if not st.stamps and not layout.random and not st.routing.catch_up:
                # The steady state: unfenced, no lookup. (One request per key: duplicates were refused above.)
                requests: dict[str, dict] = {}  # physical key -> request
                for kind, body in ops:
                    if kind == "put":
                        logical = self._logical_item(body)
                        fields = self._fields(logical)
                        key = layout.key(fields)
                        item = self._with_index_values(st, logical, fields)
                        item.update(key)
                        requests[repr(sorted(key.items()))] = {"PutRequest": {"Item": item}}
                    else:
                        _, fields = self._key(body)
                        key = layout.key(fields)
                        requests[repr(sorted(key.items()))] = {"DeleteRequest": {"Key": key}}
                try:
                    self.dynamo.batch_write(self.table, list(requests.values()), guard=self._phases.check_live,
                                            horizon=self._horizon)
                except errors.AWSError as e:
                    if _late(e):
                        raise self._phases.refused_late(e, "BatchWriteItem") from e
                    raise
                return
        finally:
            self._end(st)
        for kind, body in ops:  # a registered migration: each write on its own, fenced
            if kind == "put":
                self.put_item(Item=body)
            else:
                self.delete_item(Key=body)

    # ------------------------------------------------------------------ the protocol's steps
    def _put(self, item: dict, condition: str | None, names: dict | None, values: dict | None,
             return_old: bool = False, mirror: bool = False, old_on_failure: bool = False) -> dict:
        """One PutItem; the caller's condition is the whole contract (see the write paths).

        An authoritative write checks our liveness window before every attempt (a retry
        after it could act on an authority the fleet has left); a mirror write does not:
        it carries the whole authoritative item under its version fence, so a late one
        only ever installs that item where nothing newer is, while a mirror never sent
        would leave the write in one layout only.
        """
        kwargs = expression_kwargs(condition, names, values)
        if return_old:
            kwargs["ReturnValues"] = "ALL_OLD"
        if old_on_failure:
            kwargs["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        return self._call("put_item", guard=None if mirror else self._phases.check_live,
                          TableName=self.table, Item=item, **kwargs)

    def _put_through(self, st: PhaseState, targets: list[tuple[dict, bool]], base: Mapping[str, Any],
                     app_condition: str | None, app_names: dict, app_values: dict, *, return_old: bool,
                     tombstone: bool = False, old_on_failure: bool = False) -> dict:
        """Put ``base`` (a logical item, or a tombstone's key fields) on the authoritative
        key under the app's condition and the fence, then mirror the item it stored.

        Mirrors get exactly the stored item (same version, the winning retry's), so
        both layouts converge on it. Returns the authoritative PutItem's response.
        """
        key, mark = targets[0]
        built: dict = {}
        self._check_sizes(st, targets, base, tombstone)
        # The app's condition sees a tombstone as the absent item it stands for.
        app_condition, uses = tombstone_aware(app_condition)
        if uses:
            app_names = {**app_names, TOMBSTONE_NAME: TOMBSTONE_ATTR}

        def attempt(version, condition, names, values):
            item = dict(base)
            item.update(key)
            self._marked(item, mark)
            if version:  # always set in tombstone phases: they all stamp
                item[VERSION_ATTR] = {"S": version}
            if tombstone:
                item[TOMBSTONE_ATTR] = {"BOOL": True}
            built["item"] = item
            return self._put(item, condition, {**app_names, **names} or None, {**app_values, **values} or None,
                             return_old=return_old, old_on_failure=old_on_failure and bool(app_condition))

        _, resp = self._authoritative(st, key, app_condition, attempt)
        self._mirror_to(targets[1:], built["item"])
        if isinstance(resp, _Landed):
            # Our own attempt landed and its answer was lost: the write happened exactly once.
            if return_old:
                raise OldValuesUnknown("DeleteItem" if tombstone else "PutItem")
            return {}
        return resp

    def _check_sizes(self, st: PhaseState, targets: list[tuple[dict, bool]], base: Mapping[str, Any],
                     tombstone: bool) -> None:
        """Refuse, before the authoritative write, an item that one layout cannot store.

        The new layout's copy is larger (the marker, maybe a longer key): a put checked
        only by DynamoDB on the authoritative write would commit there and then fail on
        the mirror, leaving an acknowledged-looking half write that verify cannot repair.
        """
        if tombstone:
            return
        # A version string as long as the one the write will carry.
        version = {"S": "0" * 13 + ".000000." + self.versions.writer_id} if st.stamps else None
        for i, (key, mark) in enumerate(targets):
            item = dict(base)
            item.update(key)
            self._marked(item, mark)
            if version:
                item[VERSION_ATTR] = version
            size = item_size(item)
            if size > MAX_ITEM_BYTES:
                side = st.routing.writes[min(i, len(st.routing.writes) - 1)]
                raise ItemTooLarge("put_item", f"Item size has exceeded the maximum allowed size: the item would be "
                                   f"{size} bytes in the {side} layout of migration {self.migration.id!r} "
                                   f"(limit {MAX_ITEM_BYTES} bytes = 400 KB, including reshard's bookkeeping "
                                   "attributes and the longer key); nothing was written")

    def _mirror_to(self, mirrors: list[tuple[dict, bool]], item: Mapping[str, Any]) -> None:
        """Copy the authoritative copy's resulting ``item`` to every other layout's key."""
        for key, mark in mirrors:
            mirrored = dict(item)
            mirrored.update(key)
            self._mirror(self._marked(mirrored, mark))

    def _mirror(self, item: dict) -> None:
        """Write the full resulting item to the other layout, fenced by its own version.

        The fence keeps an older mirror (ours, delayed; or a lagging instance's) from
        overwriting a newer copy or a tombstone on that layout.
        """
        fence = fence_for(version_of(item))
        try:
            self._put(item, fence.expression, fence.names, fence.values, mirror=True)
        except errors.ConditionalCheckFailed:
            pass  # a newer write (or tombstone) is already there: it wins, as it should
        except errors.ShimUnavailable as e:
            # Late: this shim froze (or the mirror was held) past its phase fact's horizon, so
            # the fleet may have moved on (two transitions: the item may be deleted or stripped
            # since). DynamoDB refused the mirror -- or it was never sent -- and that is the
            # fence working. The authoritative write landed: the app's write succeeded; the
            # other layout catches up (the switch's newer_may_be, then verify).
            log.warning("reshard shim %s: mirror write of %s to table %r not applied, too late (the authoritative "
                        "write landed; the fleet's catch-up and verify bring the other layout up to date): %s",
                        self.instance_id, {k: item[k] for k in self.mapper.old.key_attrs if k in item}, self.table, e)
        except errors.ReshardError as e:
            # The authoritative write landed; this layout misses it until the next write,
            # a backfill re-run or verify --repair (README, Limits). Say so loudly.
            shim_metrics.mirror_failed(self.migration.id, self._phases.phase)
            log.warning("reshard shim %s: mirror write of %s to table %r failed after the authoritative write "
                        "landed (re-run `reshard verify` before the next transition): %s",
                        self.instance_id, {k: item[k] for k in self.mapper.old.key_attrs if k in item}, self.table, e)
            raise

    def _catch_up(self, st: PhaseState, fields: dict, targets: list[tuple[dict, bool]]) -> None:
        """Catch-up after an authority switch (``routing.catch_up``, docs/late-writes.md): bring
        the authoritative copy up to a newer copy of the flagged layout before writing over it.

        A mirror lost before the switch (its writer died between its two writes, or froze until
        the mirror was refused as late) left the flagged layout newer than the authoritative
        one. One consistent BatchGetItem reads the authoritative key and the flagged layout's
        copy (every candidate of a random-suffix layout); when that copy is newer (or the
        authoritative copy is missing), it is put onto the authoritative key under its own
        version's fence -- never over a newer write -- and the version clock observes it, so
        the write that follows builds on it and carries a higher version (its mirror then
        overwrites the stale copy: both layouts equal again). A tombstone is copied like an
        item: the write then builds on the absent item it stands for.
        """
        other = st.routing.catch_up
        if other is None:
            return
        auth_key, mark = targets[0]
        layout = self.mapper.layout(other)
        candidates = [k for k in layout.candidate_keys(fields) if k != auth_key]
        if not candidates:
            return  # the item does not move: one physical item serves both layouts
        found = self._batch_get([auth_key] + candidates, consistent=True)
        auth = next((i for i in found if self._key_of(i) == auth_key), None)
        copies = [i for i in found if self._key_of(i) != auth_key]
        if other == "old" and layout.random:
            # A new copy found at a key the old template also parses is not an old copy.
            copies = [i for i in copies if not self.mapper.is_new_copy(i)]
        best = newest(copies)
        if best is None or (auth is None and is_tombstone(best)):
            return
        if auth is not None and version_of(best) <= version_of(auth):
            return
        item = {k: v for k, v in best.items() if k != SOURCE_ATTR}
        item.update(auth_key)
        self._marked(item, mark)
        if not is_tombstone(item):
            item = self._with_index_values(st, item, fields)  # the phase's GSI value, as every copy it writes
        fence = fence_for(version_of(best))
        try:
            self._put(item, fence.expression, fence.names, fence.values)
        except errors.ConditionalCheckFailed:
            pass  # something at least as new landed meanwhile: the write builds on that
        self.versions.observe(version_of(best))
        log.info("reshard shim %s: caught %s up from the %s layout (version %s)", self.instance_id, auth_key, other,
                 version_of(best) or "unversioned")

    def _authoritative(self, st: PhaseState, key: dict, app_condition: str | None,
                       attempt: Callable[[str | None, str | None, dict, dict], dict],
                       update: bool = False) -> tuple[str | None, dict]:
        """Run ``attempt(version, condition, names, values)`` on the authoritative copy.

        In every phase of a registered migration the condition is the app's AND the version
        fence (the steady state stamps nothing: the app's condition as boto3 sends it, with the
        retired-copy guard below where it applies).
        On a failed condition one consistent read tells them apart:

        * the stored version *is* ours: our own attempt landed and its answer was lost (the
          client retried it): returns a :class:`_Landed` with the stored item -- the write
          happened exactly once, and is not applied again (an ``ADD`` stays single);
        * stored version >= ours: a fence loss: observe it and retry above it;
        * otherwise the application's condition failed.

        A copy a cleanup retired (``_rs_gone``) at the key is no item, in every phase, the steady
        state too: an update, and a write with an application condition, carry
        ``attribute_not_exists(_rs_gone)`` (an update would keep the copy's stale attributes, and
        hide itself under its mark; a condition judged on it would see a deleted item), and when
        the condition fails on one (one consistent read) the copy is deleted, still retired and
        unchanged, and the write is tried again. A plain put replaces it whole: no guard. In the
        steady state the guard is the only condition of ours: a failure on anything else is the
        application's condition (without one, the retired copy went meanwhile: try again).
        """
        guarded = update or bool(app_condition)
        version = self.versions.next() if st.stamps else None
        # A write that may not be repeated blindly (an update: an ADD would apply twice; a
        # conditional write: its condition would fail on its own first effect) is not sent
        # again after a lost answer: one consistent read decides (below).
        # Without a version (the steady state) nothing could tell our attempt from another
        # writer's: boto3's behaviour, a retry, stays.
        unsafe = bool(version) and guarded
        unknown = False  # an earlier attempt's outcome is unknown (it may land, or have landed)
        for _ in range(MAX_FENCE_RETRIES + 1):
            names: dict = {}
            values: dict = {}
            ours = None
            fence = fence_for(version) if version else None  # every stamping phase is fenced
            if fence is not None:
                ours = fence.expression
                names.update(fence.names)
                values.update(fence.values)
            if guarded:
                ours = and_conditions(ours, NOT_RETIRED)
                names[RETIRED_NAME] = GONE_ATTR
            condition = and_conditions(app_condition, ours)
            token = RETRY_UNKNOWN.set(False) if unsafe else None
            try:
                try:
                    return version, attempt(version, condition, names, values)
                finally:
                    if token is not None:
                        RETRY_UNKNOWN.reset(token)
            except errors.ConditionalCheckFailed as e:
                if ours is None:
                    raise  # no condition of ours (a steady plain put cannot fail): the app's failed
                # Consistent: a stale (older) version would turn our fence loss into a
                # false "condition failed" for the application. In the steady state the item
                # the failure carries will do (the fenced phases' tests compare versions on a read).
                item, retired = self._read_past_retired(key, e if fence is None else None)
                if retired:
                    continue
                if fence is None:
                    # The steady state: our guard is our only condition, and no retired copy is there now.
                    if app_condition:
                        raise
                    continue  # the retired copy our guard met went meanwhile: try again
                if own_attempt(version, item):
                    log.info("reshard shim %s: %s landed on a lost answer's first attempt; not applied again",
                             self.instance_id, key)
                    return version, _Landed(Attributes=item)
                # A stored version is input: one no reshard writer wrote (malformed, or further
                # ahead than the clocks' skew) is never adopted; this item's write is refused.
                stored = stored_version(item, self.versions.now(), f"item {_key_text(key)} of table {self.table!r}")
                if unknown:
                    # An earlier attempt's answer was lost and it may have landed (late) before
                    # this one: a fence or condition lost now cannot be told from our own
                    # effect followed by another write (r25b's B3). Not applied again.
                    raise OutcomeUnknown("UpdateItem" if update else "PutItem")
                if stored >= version:
                    self.versions.observe(stored)  # another writer is ahead: go above it
                elif app_condition:
                    raise  # the stored item is older than us, so it was the app's condition
                # Otherwise the newer item that beat our fence was removed before our read
                # (a tombstone deleted by cleanup or strip, a retired copy): try again.
                version = self.versions.next()
            except errors.AWSError as e:
                if not getattr(e, "outcome_unknown", False):
                    raise
                # Its answer was lost: did it land? Ours stored: yes (exactly once). An older
                # version stored: no (a landed attempt is only ever replaced by a newer
                # version), so send it again. Anything else: unknown.
                item = self._call("get_item", TableName=self.table, Key=key, ConsistentRead=True).get("Item")
                if own_attempt(version, item):
                    log.info("reshard shim %s: %s landed on a lost answer; not applied again", self.instance_id, key)
                    return version, _Landed(Attributes=item)
                # Sent again only on proof it did not land: an older version stored (a landed
                # attempt is replaced only by a newer version). An absent or unversioned item
                # proves nothing: a plain delete (the steady state after a retire, r25b's B2
                # when cleanup deleted plainly) may have removed our landed attempt.
                if item is not None and not is_retired(item) and \
                        version_of(item) is not None and stored_version(
                            item, self.versions.now(), f"item {_key_text(key)} of table {self.table!r}") < version:
                    unknown = True  # the lost attempt itself may still land late
                    continue
                log.warning("reshard shim %s: the outcome of a write to %s is unknown (its answer was lost, another "
                            "write is stored now); not sent again", self.instance_id, key)
                raise OutcomeUnknown("UpdateItem" if update else "PutItem") from e
        # Bounded: a writer that keeps losing (a badly lagging clock, a hot key) fails
        # the request loudly instead of spinning.
        raise errors.AWSError("write", "ReshardVersionConflict",
                              f"lost the version race on {key} {MAX_FENCE_RETRIES + 1} times; retry the request")

    def _read_past_retired(self, key: dict, failed: BaseException | None = None) -> tuple[dict | None, bool]:
        """After a failed condition: the item at ``key`` and whether it is a copy a cleanup retired
        -- then removed (:meth:`_remove_retired`): the write tries again. The item is the one
        the failure carries (``failed``: ReturnValuesOnConditionCheckFailure, where the server
        sends it: the very item the condition was judged on, no request), else one consistent read."""
        sent = getattr(failed, "response", None)
        item = sent.get("Item") if isinstance(sent, dict) else None
        if item is None:
            item = self._call("get_item", TableName=self.table, Key=key, ConsistentRead=True).get("Item")
        if is_retired(item):
            self._remove_retired(key, item)
            return item, True
        return item, False

    def _remove_retired(self, key: dict, item: Mapping[str, Any]) -> None:
        """Delete a copy a cleanup retired (``_rs_gone``), if it is still that copy: no reader
        counts it, its TTL would remove it later, and a write must not build on it."""
        fence = unchanged(version_of(item), self.mapper.keys.partition)
        try:
            self._call("delete_item", guard=self._phases.check_live, TableName=self.table, Key=key,
                       ConditionExpression=f"attribute_exists(#rs_gone) AND ({fence.expression})",
                       ExpressionAttributeNames={**fence.names, "#rs_gone": GONE_ATTR},
                       **({"ExpressionAttributeValues": fence.values} if fence.values else {}))
        except errors.ConditionalCheckFailed:
            pass  # changed since: the retried write meets what is there now

    # ------------------------------------------------------------------ sharded GSI values
    def _with_index_values(self, st: PhaseState, item: dict, fields: Mapping[str, Any]) -> dict:
        """``item`` (wire) with each sharded GSI attribute it carries set to the value of the
        layout this phase writes (``reshard.shim.index_values.write_value``)."""
        if not self._indexes:
            return item
        side = index_routing(st.phase).writes
        for im in self._indexes.values():
            value = write_value(im, item, side, self._identity_text(fields))
            if value is not None:
                item = {**item, im.attr: value}
        return item

    def _index_update_plan(self, st: PhaseState, clauses: Mapping[str, str], names: Mapping[str, str],
                           known: Mapping[str, Any]) -> IndexUpdate | None:
        """Whether this update sets GSI values in its own request (``shim/index.index_update_plan``)."""
        if not self._indexes or not clauses:
            return None
        return index_update_plan(list(self._indexes.values()), index_routing(st.phase).writes,
                                 update_effect(clauses, names), known)

    def _read_for_index(self, key: dict, plan: IndexUpdate) -> dict:
        """The attributes ``plan`` reads, consistently (an update conditioned on them follows)."""
        if not plan.reads:
            return {}
        names = {f"#rs_r{i}": a for i, a in enumerate(plan.reads)}
        names["#rs_gone"] = GONE_ATTR  # a retired copy there is no item: its fields are not the item's
        resp = self._call("get_item", TableName=self.table, Key=key, ConsistentRead=True,
                          ProjectionExpression=", ".join(names), ExpressionAttributeNames=names)
        item = resp.get("Item") or {}
        return {} if is_retired(item) else dict(item)

    def _fix_index_values(self, st: PhaseState, key: dict, full: Mapping[str, Any]) -> dict:
        """After an update: give each GSI attribute of the resulting item ``full`` the value of
        the layout this phase writes, when it has another one. Returns what it set.

        An update that writes a field the value is computed from (or the GSI attribute, or its
        sort attribute) already set the value in its own request (``index_update_plan``): here
        it is the phase's, and nothing is sent. Any other update changed nothing the value
        depends on, so this only moves an item still at the other layout's value to this
        phase's -- harmless if cut off (the shim dies, or fails closed, before it): the item is
        exactly as findable as before the update, every phase in which items may hold the
        other layout's value reads both layouts (``INDEX_ROUTING``), and the rewrite and verify
        move the rest. One more UpdateItem, only when the value differs: conditional on the GSI
        value and every field it is computed from being as read -- a write in between computed
        its own value, and a deleted item is never re-created. ``_rs_v`` is kept (the item's
        content did not change).
        """
        if is_tombstone(full):
            return {}
        side = index_routing(st.phase).writes
        fixed: dict = {}
        for im in self._indexes.values():
            try:
                value = write_value(im, full, side, self._identity_text(self.mapper.logical_fields(full)))
            except (errors.BadInput, errors.UnmappableItem) as e:
                # The update removed a field the value needs: the item stays where it is
                # (verify lists it); the write itself was the application's to make.
                log.warning("reshard shim %s: index %s value of %s not recomputed: %s", self.instance_id, im.name,
                            key, e)
                continue
            if value is None:
                continue
            names = {"#rs_g": im.attr}
            values = {":rs_g": value, ":rs_was": full[im.attr]}
            cond = ["#rs_g = :rs_was", *still_as_read(im.layout(side).needed_fields, full, "rs_f", names, values)]
            try:
                self._call("update_item", guard=self._phases.check_live, TableName=self.table, Key=key,
                           UpdateExpression="SET #rs_g = :rs_g", ConditionExpression=" AND ".join(cond),
                           ExpressionAttributeNames=names, ExpressionAttributeValues=values)
            except errors.ConditionalCheckFailed:
                # Changed since (that write computed the value from what it wrote) -- or this very
                # update landed and its answer was lost: then the item holds our value.
                now, _ = self._get(key, True)
                if now is None or now.get(im.attr) != value:
                    continue
            fixed[im.attr] = value
        return fixed
