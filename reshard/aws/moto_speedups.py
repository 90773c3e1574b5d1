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

And one fix that is not a speed-up: moto runs a DynamoDB request's condition check and its write
without a lock, so two threads (the server's request threads, or several workers in one process
under ``mock_aws``) could both pass one compare-and-set -- two workers claimed one segment in CI.
:func:`install` makes DynamoDB's handler run one request at a time (also when it patches nothing else) (``DynamoHandler.call_action``
under one lock), as a DynamoDB partition orders writes to an item. The wrapper depends on nothing
inside the function it wraps, so it is not fingerprinted.

:func:`install` is idempotent; it imports moto (the ``demo`` and ``test`` extras).

They lean on moto's private code, so they apply only to the code they were checked against:
setup.cfg bounds moto to the minor series checked, and :func:`install` first compares the source
of every function it replaces, wraps or relies on with the fingerprints of the releases checked
(:data:`KNOWN_SOURCES`). On any other source it patches nothing and logs one warning (moto then
answers as it always did, slower); the test suite installs with ``strict=True`` and stops on it.
A new moto release: run ``python3 -m reshard.aws.moto_speedups`` (it prints the fingerprints),
compare the functions' changes, run tests/functional/test_moto_speedups.py, then add them.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib
import inspect
import logging
import os
import threading

log = logging.getLogger("reshard.moto_speedups")

#: The moto releases whose sources :data:`KNOWN_SOURCES` holds (setup.cfg: moto<5.3).
CHECKED = "moto 5.2.0-5.2.5"

#: For each function the patches replace (``all_items``), wrap (``get_application``,
#: ``_serialize_type_structure``, ``query``) or rely on (the rest: what they call, and the callers
#: of ``all_items`` whose order the replacement keeps): the fingerprints (:func:`fingerprint`)
#: of its source in the releases checked.
KNOWN_SOURCES: dict[str, frozenset[str]] = {
    "moto.moto_server.werkzeug_app:DomainDispatcherApplication.get_application": frozenset({"0ff6939685bde917"}),
    "moto.core.serialize:BaseJSONSerializer._serialize_type_structure": frozenset({"36873909cd0aeb4d"}),
    "moto.core.serialize:BaseJSONSerializer._default_serialize": frozenset({"25ce8ddbb1a991c0"}),
    "moto.dynamodb.models.table:Table.all_items": frozenset({"c80d2ee3c896acd0"}),
    "moto.dynamodb.models.table:Table.query": frozenset({"002b4d00be6df07c"}),
    "moto.dynamodb.models.table:Table.scan": frozenset({"5ef1ab21eef06a74"}),
    "moto.dynamodb.models.dynamo_type:DynamoType.cast_value.fget": frozenset({"135da387dfcc7c1c"}),
}

_installed = False
_active = False
_lock = threading.Lock()
_serial = threading.RLock()  # one DynamoDB request at a time (see the module docstring)
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


class MotoNotRecognised(RuntimeError):
    """moto's code is not what the speed-ups were checked against (``install(strict=True)``)."""


def fingerprint(name: str) -> str:
    """The first 16 hex digits of the sha256 of the source of ``module:Class.function``, or
    ``"missing"`` when moto has no such function."""
    module, _, path = name.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in path.split("."):
            obj = getattr(obj, part)
        source = inspect.getsource(obj)
    except (ImportError, AttributeError, OSError, TypeError):
        return "missing"
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def unrecognised() -> list[str]:
    """The functions of this moto whose source no release checked had (empty: patch away); asked
    before :func:`install` (the patched functions are reshard's own after)."""
    return [name for name, known in KNOWN_SOURCES.items() if fingerprint(name) not in known]


def active() -> bool:
    """Whether this process runs moto with the speed-ups."""
    return _active


def _one_request_at_a_time() -> None:
    """Run moto's DynamoDB requests one at a time (the module docstring says why)."""
    from moto.dynamodb.responses import DynamoHandler
    call_action = DynamoHandler.__dict__["call_action"]

    @functools.wraps(call_action)
    def one_at_a_time(self):
        with _serial:
            return call_action(self)

    DynamoHandler.call_action = one_at_a_time


def install(strict: bool = False) -> bool:
    """Patch moto's DynamoDB backend, serializer and server dispatch in this process (once);
    True if they are in place. On a moto whose code is not the code checked: nothing is patched,
    one warning is logged and False returned, or with ``strict`` :class:`MotoNotRecognised`."""
    global _installed, _active
    with _lock:
        if _installed:
            return _active
        _installed = True
    _one_request_at_a_time()  # a fix, not a speed-up: always
    if os.environ.get("RESHARD_MOTO_SPEEDUPS") == "0":  # to measure what they save (docs/benchmarks.md)
        return False
    changed = unrecognised()
    if changed:
        import moto
        message = (f"moto {getattr(moto, '__version__', '?')} is not what reshard's moto speed-ups were checked "
                   f"against ({CHECKED}; changed: {', '.join(changed)}): running moto unpatched (the same "
                   f"answers, slower); see reshard/aws/moto_speedups.py")
        if strict:
            raise MotoNotRecognised(message)
        log.warning(message)
        return False
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
    _active = True
    return True


if __name__ == "__main__":  # the fingerprints of the installed moto, to check a new release
    import moto as _moto
    print(f"moto {_moto.__version__}")
    for _name in KNOWN_SOURCES:
        print(f"  {_name}: {fingerprint(_name)}")
