"""How a shim request reaches the data table: the phase it acts on, and every data request
signed to that phase's horizon.

Phase
    Every request asks the instance's :class:`~reshard.shim.phase_cache.PhaseCache` for
    the phase to act on (never the control table) and tells it when it is done
    (:meth:`Requests._begin` / :meth:`Requests._end`), so a new phase is acknowledged only
    after the requests on the old one drain. An index-only migration keeps items at their
    keys: its requests get one identity layout (``routing.py``: ``_index_only_routing``).

Late requests (docs/late-writes.md)
    Every request to the data table goes through :meth:`Requests._call` (or ``_batch_get``):
    signed so that DynamoDB refuses it once the server's clock passes the horizon of the
    phase fact it obeys (``PhaseCache.horizon``), a refusal for lateness being
    ``ShimUnavailable``. The table marker and copies a cleanup retired (``_rs_gone``) are no
    items to any read (``_hidden``).

A mixin of :class:`~reshard.shim.table.ShardedTable` (which sets ``table``, ``dynamo``,
``_phases`` and ``_index_only``); the module map is in ``reshard/shim/__init__.py``.
"""

from __future__ import annotations

import contextvars
from typing import Any, Callable, Mapping

from reshard import errors
from reshard.core.layout import not_data
from reshard.shim.phase_cache import PhaseState

#: The (table, phase state) of the request running in this context: its data requests are signed
#: by the fact of that phase version (``PhaseCache.horizon``); query workers run in a copy of it.
_REQUEST: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("reshard_request", default=None)


def _late(e: errors.AWSError) -> bool:
    """DynamoDB refused the request as signed too long ago (it arrived after its horizon)."""
    return e.code == "InvalidSignatureException" and "expired" in (e.aws_message or "").lower()


def _hidden(item: Mapping[str, Any] | None) -> bool:
    """An item no read returns, not even as a tombstone: the table marker, or an old-layout copy
    a cleanup retired (``_rs_gone``): for the shim it is no copy at all."""
    return not_data(item)


class Requests:
    """The phase bracket of every request and the data requests it makes (signed, late-refused)."""

    def _begin(self) -> PhaseState:
        # Every request brackets its work with _begin/_end: the phase cache must know
        # which phase versions still have requests running before it acknowledges a newer one.
        st = self._phases.begin()
        if self._index_only:
            st = self._index_only_routing(st)  # routing.py
        _REQUEST.set((self, st))
        return st

    def _end(self, st: PhaseState) -> None:
        _REQUEST.set(None)
        self._phases.end(st)

    # ------------------------------------------------------------------ data requests
    def _horizon(self) -> float | None:
        """``Dynamo.call(horizon=)`` of every data request: the server time after which DynamoDB
        refuses it, from the fact of the phase version the request runs under."""
        cur = _REQUEST.get()
        st = cur[1] if cur is not None and cur[0] is self else self._phases.current()
        return self._phases.horizon(st)

    def _call(self, operation: str, guard: Callable[[], None] | None = None, **kwargs) -> dict:
        """One request to the data table, signed to die at its horizon. A refusal for arriving
        after it is ShimUnavailable (nothing was applied; never retried as is)."""
        try:
            return self.dynamo.call(operation, guard=guard, horizon=self._horizon, **kwargs)
        except errors.AWSError as e:
            if _late(e):
                raise self._phases.refused_late(e, operation) from e
            raise

    def _get(self, key: dict, consistent: bool, **kwargs) -> tuple[dict | None, dict]:
        """(the stored item at ``key`` or None -- a retired copy or the marker count as none, the response)."""
        resp = self._call("get_item", TableName=self.table, Key=key, ConsistentRead=consistent, **kwargs)
        item = resp.get("Item")
        return (None if _hidden(item) else item), resp

    def _batch_get(self, keys: list[dict], consistent: bool, last_response: dict | None = None) -> list[dict]:
        """Every stored item at ``keys`` (BatchGetItems of 100), retired copies and the marker left out."""
        try:
            found = self.dynamo.batch_get(self.table, keys, consistent=consistent, last_response=last_response,
                                          horizon=self._horizon)
        except errors.AWSError as e:
            if _late(e):
                raise self._phases.refused_late(e, "BatchGetItem") from e
            raise
        return [i for i in found if not _hidden(i)]

    def _visible(self, resp: dict) -> dict:
        """A Query or Scan page without the items no read returns."""
        items = resp.get("Items")
        if items and any(_hidden(i) for i in items):
            resp = {**resp, "Items": [i for i in items if not _hidden(i)]}
        return resp
