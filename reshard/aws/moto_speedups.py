"""Speed-ups of moto's DynamoDB for the local servers (the demo's server process, the tests' mock_aws).

moto runs unchanged but for four per-request costs, found with a stack sampler and a
profile of the demo's server process, each replaced by code that answers exactly the same
(scan and query pages, and response bodies, were compared with and without these on S, N
and B keys, hash-only and composite tables, every attribute type):

* every server request looked for its backend under one lock, listing and stat-ing moto's
  ~200 package folders twice and trying every service's URL pattern (requests queued on
  that lock): a DynamoDB request goes to the DynamoDB app once that app exists;
* Scan sorts every item of the table on every page comparing DynamoType objects (each
  comparison re-parses both values): the same order, on each key's parsed value computed
  once per item;
* Query reads and sorts every item of the table on every call (~180 ms a query at 2,000
  items): a query of the table itself is handed only its partition's items;
* the response serializer walks the ten members of every attribute value through generic
  attribute pickers (~4 ms an item): an attribute value, already in wire form, is written
  as it is (binaries base64-encoded, as the serializer does).

:func:`install` is idempotent; it imports moto (the ``demo`` and ``test`` extras).
"""

from __future__ import annotations

import base64
import threading

_installed = False
_lock = threading.Lock()
_here = threading.local()  # the partition a Query on this thread reads, while it runs


def _wire(value: dict) -> dict:
    """An attribute value as the JSON body carries it (moto holds binaries as bytes)."""
    (kind, x), = value.items()
    if kind == "B":
        return {kind: base64.b64encode(x).decode() if isinstance(x, bytes) else x}
    if kind == "BS":
        return {kind: [base64.b64encode(b).decode() if isinstance(b, bytes) else b for b in x]}
    if kind == "M":
        return {kind: {k: _wire(e) for k, e in x.items()}}
    if kind == "L":
        return {kind: [_wire(e) for e in x]}
    return value


def _order(item) -> tuple:
    # DynamoType compares by cast_value (one key type per table attribute): the same order.
    if item.range_key:
        return (item.hash_key.cast_value, item.range_key.cast_value)
    return (item.hash_key.cast_value,)


def _shapes_known() -> bool:
    """Whether moto's internals are the ones patched below (setup.cfg allows any moto >= 5.0;
    these were written against 5.x): every patched name exists and ``Table.query`` takes the
    index name 7th after the hash key (``args[6]``), where ``partition_query`` looks for it."""
    import inspect
    try:
        import moto
        from moto.core.serialize import BaseJSONSerializer
        from moto.dynamodb.models.table import Table
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication
        params = list(inspect.signature(Table.query).parameters)
    except (ImportError, AttributeError, TypeError, ValueError):
        return False
    return (str(getattr(moto, "__version__", "")).startswith("5.")
            and hasattr(DomainDispatcherApplication, "get_application")
            and hasattr(BaseJSONSerializer, "_serialize_type_structure")
            and hasattr(BaseJSONSerializer, "_default_serialize")
            and hasattr(Table, "all_items")
            and params[:2] == ["self", "hash_key"] and len(params) > 8 and params[8] == "index_name")


def install() -> None:
    """Patch moto's DynamoDB backend, serializer and server dispatch in this process (once)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    if not _shapes_known():
        return  # another moto than the one these were written against: run it unpatched (slower, same answers)
    from moto.core.serialize import BaseJSONSerializer
    from moto.dynamodb.models.table import Table
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    get_application = DomainDispatcherApplication.get_application

    def dynamodb_application(self, environ):
        if (environ.get("HTTP_X_AMZ_TARGET", "").startswith("DynamoDB_20120810.")
                and "/dynamodb/aws4_request" in environ.get("HTTP_AUTHORIZATION", "")):
            app = self.app_instances.get("dynamodb")
            if app is not None:
                return app
        return get_application(self, environ)

    structure = BaseJSONSerializer._serialize_type_structure

    def attribute_value_as_is(self, serialized, value, shape, key):
        if shape.name == "AttributeValue" and isinstance(value, dict) and len(value) == 1:
            self._default_serialize(serialized, _wire(value), shape, key)
        else:
            structure(self, serialized, value, shape, key)

    def all_items(self):
        part = getattr(_here, "partition", None)
        if part is None or part[0] is not self:
            every = ([i for h in self.items.values() for i in h.values()] if self.range_key_attr
                     else list(self.items.values()))
            return sorted(every, key=_order)
        got = self.items.get(part[1])
        if got is None:
            return []
        return sorted(got.values(), key=_order) if self.range_key_attr else [got]

    query = Table.query

    def partition_query(self, hash_key, *args, **kwargs):
        index = args[6] if len(args) > 6 else kwargs.get("index_name")
        if index or hash_key is None:
            return query(self, hash_key, *args, **kwargs)
        _here.partition = (self, hash_key)
        try:
            return query(self, hash_key, *args, **kwargs)
        finally:
            _here.partition = None

    DomainDispatcherApplication.get_application = dynamodb_application
    BaseJSONSerializer._serialize_type_structure = attribute_value_as_is
    Table.all_items, Table.query = all_items, partition_query
