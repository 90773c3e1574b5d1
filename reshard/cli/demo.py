"""``reshard demo``: a whole migration on a local DynamoDB with live traffic (see :mod:`reshard.demo`)."""

from __future__ import annotations

import click

from reshard.cli.options import Env, command, is_tty
from reshard.demo import DemoFailed, DemoOptions, render_report, run_demo


@command("demo")
@click.option("--items", type=click.IntRange(10, 1_000_000), default=DemoOptions.items, show_default=True,
              help="Items in the table before the migration.")
@click.option("--from-shards", type=click.IntRange(1, 1000), default=DemoOptions.from_shards, show_default=True,
              help="Shards of the layout the table has today.")
@click.option("--to-shards", type=click.IntRange(1, 1000), default=DemoOptions.to_shards, show_default=True,
              help="Shards of the layout to move to.")
@click.option("--app-threads", type=click.IntRange(1, 64), default=DemoOptions.app_threads, show_default=True,
              help="Application threads, each with its own shim, running traffic throughout.")
@click.option("--segments", type=click.IntRange(1, 1000), default=DemoOptions.segments, show_default=True,
              help="Parallel-scan segments of backfill, verify and cleanup.")
@click.option("--table", default=DemoOptions.table, show_default=True,
              help="Name of the demo table (it must not exist yet).")
def demo(env: Env, items, from_shards, to_shards, app_threads, segments, table) -> None:
    """Run a whole migration on a local DynamoDB, with live application traffic.

    \b
    Starts an embedded DynamoDB (moto's server on a free 127.0.0.1 port; needs
    `pip install -e '.[demo]'`) unless --endpoint-url names another server; creates
    the SensorEvents table (PK = sensor_id#(sha256(event_id) % N), SK = timestamp),
    fills it, and walks planned -> dual_write -> dual_read -> backfill (+ verify) ->
    cutover -> cleanup -> complete while app threads put, update, delete, get and
    query through ShardedTable. Ends with a report; exit 0 only if every check held
    (no app error, read-your-writes, verify passed, every write reads back).

    \b
    Example:
      reshard demo
      reshard demo --items 500 --from-shards 4 --to-shards 8 --app-threads 2
      reshard demo --output json > report.json
      reshard demo --endpoint-url http://127.0.0.1:8000 --table SensorEventsDemo
    """
    if from_shards == to_shards:
        raise click.BadParameter("must differ from --from-shards", param_hint="--to-shards")
    opts = DemoOptions(items=items, from_shards=from_shards, to_shards=to_shards, app_threads=app_threads,
                       segments=segments, table=table, control_table=env.control_table,
                       progress=is_tty() and not env.machine)
    report = run_demo(opts, env.endpoint_url, say=env.info)
    env.emit(report, lambda: render_report(report))
    if not report["ok"]:
        raise DemoFailed("the demo failed: " + "; ".join(report["failures"]))
