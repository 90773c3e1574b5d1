"""A migration re-keying the table and a sharded GSI at once: the one index the shim refuses."""

from __future__ import annotations

import pytest

from reshard import errors
from reshard.core.migration import parse
from reshard.shim.table import ShardedTable

TEXT = """\
id = "combined"
table = "Invoices"
[keys]
partition = "PK"
sort = "SK"
[from]
partition = "INV#{invoice}#{shard}"
sort = "{line}"
shards = 2
shard_by = ["invoice"]
[to]
partition = "INV#{invoice}#{shard}"
sort = "%s"
shards = 4
shard_by = ["invoice"]
[index.ByLine]
partition = "gsi_shard"
sort = "SK"
[index.ByLine.from]
partition = "{shard}"
shards = 2
shard_by = ["customer"]
[index.ByLine.to]
partition = "{shard}"
shards = 4
shard_by = ["customer"]
"""


def test_a_gsi_sort_key_the_migration_rewrites_is_refused_and_one_it_keeps_is_not():
    rewritten = parse(TEXT % "L#{line}", "<c>")
    with pytest.raises(errors.BadInput, match="index ByLine's sort key 'SK' is a key attribute the migration rewrites"):
        ShardedTable(rewritten, None, control_table=None, start=False)
    # A sort key kept as it is ("{SK}" in both layouts) sorts both copies alike.
    kept = parse(TEXT.replace('"{line}"', '"{SK}"') % "{SK}", "<c>")
    ShardedTable(kept, None, control_table=None, start=False).close()
