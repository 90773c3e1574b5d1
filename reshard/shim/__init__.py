"""The application shim: :class:`ShardedTable`, used in place of boto3's ``Table``."""

from reshard.shim.table import ShardedTable

__all__ = ["ShardedTable"]
