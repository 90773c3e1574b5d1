"""reshard: change the shard count of a write-sharded DynamoDB table, online.

Applications import :class:`ShardedTable` (the shim). Everything else is the
operator's tool (``reshard`` on the command line).

The shim is imported lazily so that the pure domain modules (``reshard.core.layout``,
``reshard.core.phases``, ``reshard.core.migration``, ``reshard.core.planning``, ``reshard.core.versions``)
can be imported without boto3.
"""

__version__ = "0.1.0"

__all__ = ["ShardedTable", "__version__"]


def __getattr__(name):
    if name == "ShardedTable":
        from reshard.shim.table import ShardedTable
        return ShardedTable
    raise AttributeError(f"module 'reshard' has no attribute {name!r}")
