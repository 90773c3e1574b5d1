"""What a request answers, in boto3's shape: ``ReturnValues`` and ``ResponseMetadata``.

* :meth:`Answers._response`: a put's or delete's ``{"Attributes"?, "ResponseMetadata"}``
  (the old item as the application knows it, ``ALL_OLD``);
* :meth:`Answers._with_key`: every returned item carries the request's key fields as the
  app typed them (a field kept only inside a key template may not be stored);
* :meth:`Answers._update_answer`: an update's, for each ``ReturnValues`` -- ``UPDATED_*``
  keep the paths the app's actions wrote (also when the whole new item came back for the
  mirror); an old tombstone is no old item;
  bookkeeping attributes and physical key attributes never reach the application
  (:meth:`Answers._strip`);
* :meth:`Answers._failed_item`: ``ReturnValuesOnConditionCheckFailure`` -- the logical item a
  failed condition saw, in ``e.response["Item"]``;
* :func:`_metadata`: the ``ResponseMetadata`` of the request that decided the answer; a query's
  or scan's is its last physical page's (:func:`_with_page_meta`, :func:`_note_page`).

Which ``ReturnValues`` the shim itself asks DynamoDB for (``ALL_NEW`` when a mirror needs the
whole new item) is the write protocol's (``writes.py``). A mixin of
:class:`~reshard.shim.table.ShardedTable`; the module map is in ``reshard/shim/__init__.py``.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any, Mapping

from reshard import errors
from reshard.aws.dynamo import from_wire, to_wire
from reshard.core import expressions
from reshard.core.layout import Layout, is_tombstone
from reshard.core.migration import RESERVED_PREFIX
from reshard.shim.expr import updated_paths
from reshard.shim.requests import _hidden


def _metadata(resp: Mapping[str, Any]) -> dict:
    """``{"ResponseMetadata": ...}`` of the request that decided the answer (when the client gave one)."""
    meta = resp.get("ResponseMetadata")
    return {"ResponseMetadata": meta} if meta is not None else {}


#: The ``ResponseMetadata`` of the last physical page a query or scan read (a list the request's
#: context and its pool workers share): the answer's, as boto3's query/scan carry one.
_PAGE_META: contextvars.ContextVar[list | None] = contextvars.ContextVar("reshard_page_meta", default=None)


def _note_page(resp: Mapping[str, Any]) -> None:
    seen = _PAGE_META.get()
    if seen is not None and resp.get("ResponseMetadata") is not None:
        seen[:] = [resp["ResponseMetadata"]]


def _with_page_meta(fn):
    """A query/scan method whose answer carries the last page's ``ResponseMetadata`` (boto3's shape)."""
    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        seen: list = []
        token = _PAGE_META.set(seen)
        try:
            resp = fn(self, *args, **kwargs)
        finally:
            _PAGE_META.reset(token)
        if seen and "ResponseMetadata" not in resp:
            resp["ResponseMetadata"] = seen[0]
        return resp
    return method


class Answers:
    """The answers of :class:`~reshard.shim.table.ShardedTable`'s writes (and a failed condition's item)."""

    def _response(self, old: Mapping[str, Any] | None, layout: Layout, resp: Mapping[str, Any],
                  key_wire: Mapping[str, Any]) -> dict:
        """A write's answer in boto3's shape: ``{"Attributes"?, "ResponseMetadata"}``."""
        out = self._with_key(self._to_app(old, layout) if old else None, key_wire)
        meta = _metadata(resp)
        return {"Attributes": out, **meta} if out else meta

    def _strip(self, attrs: Mapping[str, Any] | None) -> dict | None:
        """Returned attributes without bookkeeping and physical keys (for UPDATED_* values)."""
        if not attrs or is_tombstone(attrs) or _hidden(attrs):
            return None
        return from_wire({k: v for k, v in attrs.items()
                          if not k.startswith(RESERVED_PREFIX) and (k not in self._key_attrs or k in self._kept)})

    def _with_key(self, out: dict | None, key_wire: Mapping[str, Any]) -> dict | None:
        """A returned item with the request's key fields as the app typed them: a field kept
        only inside a string key template parses back as a string (and may not be stored)."""
        if out is not None:
            out.update(from_wire({f: key_wire[f] for f in self._key_fields if f in key_wire}))
        return out

    def _failed_item(self, e: errors.ConditionalCheckFailed, key: dict, layout: Layout) -> None:
        """``e.response["Item"]``: the logical item the app's condition failed on (none if absent or
        a tombstone), in the wire form boto3's Table leaves it there (its resource layer does not
        deserialize error responses).

        The authoritative request asked DynamoDB for it (the item as the condition saw it, no
        extra read). A response without it -- the item was absent, or a server without
        ReturnValuesOnConditionCheckFailure (dynalite) -- is answered by one consistent read.
        """
        response = getattr(e, "response", None)
        if not isinstance(response, dict):
            return
        stored = response.get("Item")
        if stored is None:
            stored = self._call("get_item", TableName=self.table, Key=key, ConsistentRead=True).get("Item")
        app = self._to_app(stored, layout) if stored else None
        if app is None:
            response.pop("Item", None)
        else:
            response["Item"] = to_wire(app)

    def _update_answer(self, rv: str, resp: Mapping[str, Any], attrs: Mapping[str, Any] | None,
                       targets: list[str], internal_rv: str, landed: bool, clauses: Mapping[str, str],
                       app_names: Mapping[str, str], key_wire: Mapping[str, Any]) -> dict:
        """``update_item``'s answer for ``ReturnValues`` ``rv`` from what DynamoDB returned (``attrs``,
        of the authoritative write ``resp``, asked as ``internal_rv``, or the stored item of our
        ``landed`` attempt; ``targets``: the attributes the app's actions touch)."""
        meta = _metadata(resp)
        if rv == "NONE":
            return meta
        if rv in ("UPDATED_NEW", "UPDATED_OLD"):
            # Only what the app's actions touched: the shim's own SETs (key fields,
            # bookkeeping) count as "updated" for DynamoDB too.
            wanted = set(targets)
            attrs = {k: v for k, v in (attrs or {}).items() if k in wanted}
            if rv != internal_rv or landed:
                # The whole new item came back (the mirror needs it, or the stored item of our
                # landed attempt): DynamoDB's answer is the updated paths only (SET m.b.c: {m: {b: {c}}}).
                paths = updated_paths(clauses, app_names)
                if paths is not None:
                    try:
                        attrs = expressions.project(attrs, paths)
                    except expressions.ExprError:
                        pass  # overlapping paths: DynamoDB refused the update already
        if rv in ("ALL_OLD", "UPDATED_OLD") and attrs and is_tombstone(attrs):
            attrs = None
        out = self._strip(attrs)
        if rv in ("ALL_OLD", "ALL_NEW"):
            out = self._with_key(out, key_wire)
        return {"Attributes": out, **meta} if out else meta
