"""The application shim: :class:`ShardedTable`, used in place of boto3's ``Table``.

Where each rule lives (one role per module; docs/architecture.md has the same map):

==================  ===============  ==========================================================
module              role             its rule
==================  ===============  ==========================================================
table.py            API              the boto3 surface, a facade: constructors (the app's
                                     ``session=``/``client=``/``config=``, the control table),
                                     public methods and their argument checks, ``client_errors`` /
                                     ``with_capacity``, boto3's Table attributes, ``meta``
                                     (GuardedClient), ``batch_writer()``; each method hands on to
                                     the modules below
errors.py           API              what the shim raises: botocore ``ClientError``\\ s
requests.py         requests         the phase a request acts on (``_begin``/``_end``), every
                                     data request signed to that phase's horizon (late refusal),
                                     hidden items (table marker, retired copies)
routing.py          routing          the physical keys of a logical item in the layouts a phase
                                     writes (authoritative first, new-copy marker, random-suffix
                                     lookup) and reads; an index-only migration's identity
                                     layout; a sharded GSI's index routing
writes.py           write protocol   authoritative write + mirror, version fences, own-attempt
                                     recognition, catch-up, retired copies, tombstones, sizes,
                                     the plain and batched writes of unfenced phases, GSI values
                                     of a write (checked against the model: tests/model)
index_values.py     write protocol   the value a write gives a sharded GSI's partition attribute,
                                     and an update's plan to set it in the same request
reads.py            reads            which copies a read reads and which it returns (newest,
                                     tombstone = absent), the query pool, index-entry resolution
query.py            reads            the fan-out query over every shard of every layout, merged
scan.py             reads            the scan: every live logical item once, at its designated copy
index.py            reads            the fan-out query of a sharded GSI (two passes, resolution)
app_expressions.py  expressions      the app's expressions as boto3 takes them: condition objects
                                     to text, placeholders, FilterExpression / Projection / Select;
                                     conditions on key fields decided from the request's key
expr.py             expressions      the app's expressions rewritten for the physical table:
                                     merged UpdateExpression, fence AND condition, tombstone-aware
                                     conditions
returns.py          expressions      what a request answers: ``ReturnValues``, the item a failed
                                     condition saw, ``ResponseMetadata``
phase_cache.py      phase            the phase this instance acts on: refresh, heartbeat,
                                     acknowledgement, liveness, switch hold, horizon facts
metrics.py          metrics          the shim's OpenTelemetry instruments
==================  ===============  ==========================================================

``ShardedTable`` is the facade class of ``table.py``; its private methods come from one mixin
per role (``Requests``, ``Routes``, ``WriteProtocol``, ``Reads``, ``AppExpressions``, ``Answers``), so a reviewer
reads the write protocol in ``writes.py`` alone, and every method keeps its name on the
instance (tests and the model patch them there).
"""

from reshard.shim.table import ShardedTable

__all__ = ["ShardedTable"]
