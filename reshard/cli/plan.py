"""``reshard plan FILE``: validate a migration against the live table and show what it will do.

Read-only: DescribeTable, DescribeTimeToLive and Scan, nothing else
(:func:`reshard.operations.plan`); the arithmetic lives in :mod:`reshard.core.planning`.
"""

from __future__ import annotations

import shlex

import click

from reshard import errors, operations
from reshard.cli import render
from reshard.cli.options import Env, command, max_rcu_option, max_wcu_option
from reshard.core import planning
from reshard.core.migration import load


@command("plan", short_help="Check a migration file against the live table and estimate the work.")
@click.argument("file", type=click.Path(dir_okay=True))
@click.option("--sample", type=click.IntRange(min=0), default=planning.DEFAULT_SAMPLE, show_default=True,
              help="Items to sample, spread over the scan segments; 0 scans the whole table.")
@click.option("--segments", type=click.IntRange(1, 1000), default=8, show_default=True,
              help="Parallel-scan segments (TotalSegments) for the sample or the full scan.")
@max_wcu_option
@click.option("--count", is_flag=True,
              help="Count the items exactly (a parallel Select=COUNT scan, charged like a full scan; --max-rcu "
                   "paces it) instead of trusting DescribeTable's ItemCount, which DynamoDB refreshes about "
                   "every 6 hours (0 on local servers).")
@max_rcu_option
@click.option("--peak-writes-per-sec", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Peak writes per second to the hottest entity (for the recommended shard count).")
@click.option("--item-kb", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Item size in KB for the recommendation (default: the sample's mean item size).")
@click.option("--headroom", type=click.FloatRange(min=1), default=planning.DEFAULT_HEADROOM, show_default=True,
              help="Factor over the minimum shard count in the recommendation.")
@click.option("--write-price", type=click.FloatRange(min=0), default=planning.DEFAULT_WRITE_PRICE,
              show_default=True, help="USD per million on-demand write request units (us-east-1 list price).")
@click.option("--read-price", type=click.FloatRange(min=0), default=planning.DEFAULT_READ_PRICE,
              show_default=True, help="USD per million on-demand read request units (us-east-1 list price).")
def plan(env: Env, file: str, sample: int, segments: int, max_wcu: float | None, count: bool,
         max_rcu: float | None, peak_writes_per_sec: float | None, item_kb: float | None, headroom: float,
         write_price: float, read_price: float) -> None:
    """Validate FILE against the live table; show items, moves, shard skew, capacity, cost and next steps.

    \b
    Also compares [to] with the same layout on hash = "jump": the items that move now,
    in a later doubling and in a later M -> M + M/2 growth, and whether jump pays.

    \b
    Samples --sample items (default 2000) over --segments parallel-scan segments, or
    scans everything with --sample 0. Estimates are scaled to the table's item count:
    DescribeTable's ItemCount (refreshed about every 6 hours; the report says so and
    warns when it is stale), the full scan's, or an exact count with --count.
    On-demand prices default to us-east-1 list prices: check yours.

    \b
    An index-only file ([index.NAME], no [from]/[to]) checks the GSI (it exists, its key
    schema and partition type match, its projection carries _rs_v), and shows the items
    per GSI shard before and after and the rewrite's WCU (the table write plus the GSI's
    delete and put of each rewritten item). A file with both [from]/[to] and
    [index.NAME] shows both analyses; the GSI half's WCU also counts each new copy's
    GSI put (JSON: migration.indexes, indexes, capacity_gsi).

    \b
    "start will refuse" lists what `reshard start` refuses (it runs the same checks):
    key types, templates that match no item, unmappable or too-large items (unless
    `start --allow-unmappable N`), new-key collisions. Exit status 1 when that list is
    not empty (the report is still printed), 0 when `start` would accept the file, 2
    for a bad file or option.

    \b
    Example:
      reshard plan migrations/0001_sensor_events.toml
      reshard plan migrations/0001_sensor_events.toml --count --max-rcu 500
      reshard plan migrations/0001_sensor_events.toml --max-wcu 2000 \\
          --peak-writes-per-sec 2000 --item-kb 1
    """
    operations.check_plan_options(peak_writes_per_sec, item_kb)
    m = load(file)
    result = operations.plan(env.dynamo(), m, sample=sample, segments=segments, max_wcu=max_wcu,
                             peak_writes_per_sec=peak_writes_per_sec, item_kb=item_kb, headroom=headroom,
                             write_price=write_price, read_price=read_price, count=count, max_rcu=max_rcu,
                             say=env.info)
    if isinstance(result, operations.IndexPlanReport):
        report = render.plan_index_data(result, file, _global_prefix(env))
        env.emit(report, lambda: render.plan_index_text(report))
    else:
        report = render.plan_data(result, file, _global_prefix(env))
        env.emit(report, lambda: render.plan_text(report, result.analysis))
    if result.blockers:
        # The same list `start` refuses with (operations.start_problems): a script that runs
        # `plan && start` stops here, not at start.
        raise errors.StartWouldRefuse(f"`reshard start` would refuse {file}: {len(result.blockers)} problem(s), "
                                      "listed under \"start will refuse\" (JSON: start_refuses)")


def _global_prefix(env: Env) -> str:
    out = ""
    if env.endpoint_url:
        out += f" --endpoint-url {shlex.quote(env.endpoint_url)}"
    if env.region:
        out += f" --region {shlex.quote(env.region)}"
    if env.profile:
        out += f" --profile {shlex.quote(env.profile)}"
    return out
