"""Click options and plumbing shared by the commands: each option is declared here once.

Every command takes the global options (``--endpoint-url``, ``--region``,
``--profile``, ``--control-table``, ``--output``, ``--query``, ``--verbose``) either before the
command name (``reshard --output json status``) or after it (``reshard status
--output json``). Commands receive a :class:`Env` that builds the DynamoDB client
and the control store lazily, so ``--help`` and bad input never touch AWS.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import click

from reshard import errors
from reshard.cli import formats
from reshard.aws.dynamo import CONNECT_TIMEOUT_SECONDS, FIRST_CONTACT_ATTEMPTS, READ_TIMEOUT_SECONDS, Dynamo
from reshard.control.store import DEFAULT_CONTROL_TABLE, ControlStore, resolve
from reshard.core.decode import MAX_LEASE_SECONDS, safe_text
from reshard.core.phases import Phase
from reshard.jobs.engine import DEFAULT_LEASE_SECONDS

_GLOBALS = ("endpoint_url", "region", "profile", "control_table", "output", "query", "verbose")

#: When the running command started (wall clock; :func:`reshard.cli.main.main` sets ``at`` first
#: thing, per thread: tests run commands in threads): a phase move recorded after it is one its
#: operator cannot have seen.
STARTED_AT = threading.local()


@dataclass
class Env:
    """What a command needs from the global options."""

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    control_table: str = DEFAULT_CONTROL_TABLE
    output: str | None = None  # None: no --output given (the text for people)
    query: str | None = None
    verbose: bool = False
    started_at: float | None = field(default_factory=lambda: getattr(STARTED_AT, "at", None))
    _dynamo: Dynamo | None = field(default=None, repr=False)
    _store: ControlStore | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._query = formats.compile_query(self.query)  # a bad --query is refused before any work

    @property
    def json(self) -> bool:
        return self.output == "json"

    @property
    def machine(self) -> bool:
        """stdout carries data for a program (any --output, or a --query result): banners go to stderr."""
        return self.output is not None or self.query is not None

    def dynamo(self, **kwargs) -> Dynamo:
        if self._dynamo is None:
            kwargs.setdefault("first_contact_attempts", FIRST_CONTACT_ATTEMPTS)  # a dead --endpoint-url: exit 2 at once
            self._dynamo = Dynamo(endpoint_url=self.endpoint_url, region=self.region, profile=self.profile, **kwargs)
        return self._dynamo

    def client_factory(self) -> Callable[[], Dynamo]:
        """How a ``--processes`` child builds its own client (picklable: the same global options). The
        whole retry policy from the first request: the parent's client has reached the endpoint."""
        return functools.partial(Dynamo, endpoint_url=self.endpoint_url, region=self.region, profile=self.profile)

    def store(self) -> ControlStore:
        if self._store is None:
            self._store = ControlStore(self.dynamo(), self.control_table)
        return self._store

    def migration_id(self, ref: str | None) -> str:
        """Resolve MIGRATION (file, id, or nothing when exactly one is active)."""
        return resolve(self.store(), ref)

    def emit(self, data: dict, text: str | Callable[[], str]) -> None:
        """Print a command's result: ``data`` through --query and --output, or ``text`` for people
        (the one rendering path, :func:`reshard.cli.formats.emit_text`)."""
        click.echo(safe_text(formats.emit_text(data, text, self.output, self._query), None, keep_lines=True))

    def info(self, message: str) -> None:
        """A progress or banner line: stderr unless stdout is plain text, so stdout stays data."""
        click.echo(safe_text(errors.scrub(message), None, keep_lines=True), err=self.machine)


def _store_global(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Keep a global option in ctx.meta so a value given before the command carries over."""
    if value is not None and value is not False:
        ctx.meta[f"reshard.{param.name}"] = value
    return value


def global_options(f: Callable) -> Callable:
    """The global options, for the group and for every command."""
    options = [
        click.option("--endpoint-url", default=None, expose_value=False, callback=_store_global,
                     help="DynamoDB endpoint (a local server); AWS_ENDPOINT_URL[_DYNAMODB] also work."),
        click.option("--region", default=None, expose_value=False, callback=_store_global,
                     help="AWS region (default: the standard AWS configuration)."),
        click.option("--profile", default=None, expose_value=False, callback=_store_global,
                     help="AWS profile from the standard credential files."),
        click.option("--control-table", default=None, expose_value=False, callback=_store_global,
                     envvar="RESHARD_CONTROL_TABLE", show_envvar=True,
                     help=f"Control table name (default {DEFAULT_CONTROL_TABLE})."),
        click.option("--output", type=click.Choice(formats.FORMATS), default=None, expose_value=False,
                     callback=_store_global,
                     help="json (times in ISO 8601), text (aws-cli's tab-separated text of the same document, for "
                          "cut and shell loops) or table. Without it: the text for people."),
        click.option("--query", default=None, expose_value=False, callback=_store_global, metavar="JMESPATH",
                     help="A JMESPath expression applied to the command's data (its --output json document) "
                          "before it is printed, as in aws-cli; e.g. --query 'jobs[].progress'."),
        click.option("--verbose", "-v", is_flag=True, default=False, expose_value=False, callback=_store_global,
                     help="Show a traceback with errors."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


def pass_env(f: Callable) -> Callable:
    """Give the command an :class:`Env` built from the global options."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        ctx = click.get_current_context()
        values = {}
        for name in _GLOBALS:
            for c in _ctx_chain(ctx):
                if f"reshard.{name}" in c.meta:
                    values[name] = c.meta[f"reshard.{name}"]
                    break
        env = Env(**values)
        ctx.obj = env
        return f(env, *args, **kwargs)

    return wrapper


def _ctx_chain(ctx: click.Context):
    while ctx is not None:
        yield ctx
        ctx = ctx.parent


def command(name: str | None = None, **kwargs) -> Callable:
    """``@command("name")``: a command with the global options and an Env argument.

    It is not attached to a group: :mod:`reshard.cli.main` adds it, so no command
    module needs the group (and the import circle that came with it).
    """

    def deco(f: Callable) -> Callable:
        return click.command(name=name, **kwargs)(global_options(pass_env(f)))

    return deco


migration_argument = click.argument("migration", required=False, metavar="[MIGRATION]")

workers_option = click.option("--workers", type=click.IntRange(1, 256), default=None,
                              help="Worker threads per process (default: min(segments, 4)).")
processes_option = click.option(
    "--processes", type=click.IntRange(1, 1024), default=None, envvar="RESHARD_PROCESSES", show_envvar=True,
    help="Worker processes on this host (default: the cores it may use, at most --segments). Each has its own "
         "DynamoDB client, --workers and --concurrency, and joins the run like another host would (the segment "
         "leases decide who does what, and each is a member of the run's --max-wcu/--max-rcu budget); 1 runs the "
         "job in this process.")


def resolve_processes(processes: int | None, segments: int) -> int:
    """``--processes`` as used: the cores when not given, never more than the segments
    (a process without a segment to lease would only wait)."""
    from reshard.jobs.processes import default_processes
    return max(1, min(processes or default_processes(), segments))


concurrency_option = click.option(
    "--concurrency", type=click.IntRange(1, 64), default=8, show_default=True,
    help="Per-item writes of a page in flight at once, per worker (each one conditional request; "
         "more hides the round trip, the budget still paces them).")
segments_option = click.option("--segments", type=click.IntRange(1, 1_000_000), default=16, show_default=True,
                               help="Parallel-scan segments (TotalSegments).")
max_wcu_option = click.option(
    "--max-wcu", type=click.FloatRange(min=0, min_open=True), default=None,
    help="Write capacity budget in WCU/s for the whole job run, however many processes and hosts run it: "
         "each paces at its share (budget / live members, kept in the run's budget row in the control "
         "table). A process started without it joins the run's budget. See docs/deploy.md.")
max_rcu_option = click.option(
    "--max-rcu", type=click.FloatRange(min=0, min_open=True), default=None,
    help="Read capacity budget in RCU/s for the whole job run, shared like --max-wcu.")
max_wcu_per_key_option = click.option(
    "--max-wcu-per-key", type=click.FloatRange(min=0), default=800.0, show_default=True,
    help="The copy's write rate per new partition key value, WCU/s, on this host (divided among its "
         "--processes; several hosts: give each its part). DynamoDB serves one key at most 1,000 WCU/s "
         "whatever the budget: a layout with few new keys is copied at what each key takes, the rest of "
         "the budget goes to the others. 0: not paced per key.")
host_id_option = click.option(
    "--host-id", default=None, envvar="RESHARD_HOST_ID", show_envvar=True, metavar="NAME",
    help="This process's name in the run's budget row (default: the host name), e.g. a Kubernetes "
         "completion index or an AWS Batch array index. Names only: leases still identify the host by name.")


def page_size_option(help: str = "Items per Scan page.") -> Callable:
    """``--page-size`` of the data jobs (the help differs a little per command)."""
    return click.option("--page-size", type=click.IntRange(1, 100_000), default=500, show_default=True, help=help)


#: The time fence of the data jobs' writes, as ``--lease-seconds`` explains it (see
#: reshard.jobs.engine: the local deadline; reshard.jobs.runner.run_job: one attempt bounded
#: to a third of the lease).
LEASE_FENCE_HELP = (
    "It must exceed the longest request: each attempt of a request is bounded by its connect + read "
    f"timeout ({CONNECT_TIMEOUT_SECONDS:g} s + {READ_TIMEOUT_SECONDS:g} s, shortened to a third of the lease "
    "when that is less). Before every write attempt a worker checks its lease's local deadline (its last "
    "renewal + the lease - the longest attempt, on its monotonic clock); a worker stalled past it (a pause, "
    "a frozen VM, a lost network) sends nothing more and gives the segment up, and whoever claims it next "
    "redoes the page from the last checkpoint.")


def lease_seconds_option(help: str = "How long a segment lease lasts without a renewal before another worker "
                                     "may take the segment over.") -> Callable:
    """``--lease-seconds`` of the data jobs (the help differs a little per command; the
    time fence that goes with it is the same for all)."""
    return click.option("--lease-seconds", type=click.FloatRange(min=1.0, max=MAX_LEASE_SECONDS),
                        default=DEFAULT_LEASE_SECONDS,
                        show_default=True, help=f"{help} {LEASE_FENCE_HELP}")


from_option = click.option(
    "--from", "from_phase", type=click.Choice([p.value for p in Phase]), default=None, metavar="PHASE",
    help="Act only if the migration is in PHASE now (guards scripts and a second operator against "
         "moving it twice).")
allow_no_shims_option = click.option(
    "--allow-no-shims", is_flag=True, default=False,
    help="Transition even though no live shim reports for the table (only when nothing writes it: an empty "
         "census also looks like shims reporting to another control table).")
dry_run_option = click.option(
    "--dry-run", is_flag=True, default=False,
    help="Say what the command would do now and why -- each precondition with its state -- and write nothing "
         "(one look at the fleet and the job leases, no waiting). Exit 0 if it would go, 1 if it is refused only "
         "for now (shims not caught up, a job lease still held: `reshard wait` may clear it), 2 if the rules "
         "refuse it.")
wait_option = click.option(
    "--wait", "wait", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
    help="Wait up to SECONDS for the fleet: first for every live shim to acknowledge the current phase, "
         "then, after the transition, for it to acknowledge the new one. Into cutover, the same SECONDS also "
         "cover waiting for backfill and verify segment leases to go quiet (each unchanged for its lease + the "
         "longest request, watched on this host's clock): a worker stalled past its lease could still write "
         "until then. Without --wait a held lease refuses the cutover.")


def is_tty() -> bool:
    """A person watches: both stdout and stderr are a terminal (a bar there, log lines otherwise)."""
    return sys.stdout.isatty() and sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


#: Seconds between two progress log lines when stdout is not a terminal.
PROGRESS_SECONDS_ENV = "RESHARD_PROGRESS_SECONDS"


def job_progress(env: "Env", job: str, mid: str, options) -> list:
    """The progress subscriber of a data job (:class:`reshard.jobs.subscribers.ProgressReporter`):
    nothing until every precondition passed, then a header and a tqdm bar on a terminal, or a log
    line every $RESHARD_PROGRESS_SECONDS (default 10) seconds otherwise."""
    from reshard import operations
    from reshard.jobs.subscribers import ProgressReporter

    try:
        interval = float(os.environ.get(PROGRESS_SECONDS_ENV, "10"))
    except ValueError:
        raise errors.BadInput(f"${PROGRESS_SECONDS_ENV} must be a number of seconds") from None
    from reshard.cli.metrics import job_metrics

    store, dynamo = env.store(), env.dynamo()
    segments = options.segments + (job == "verify")  # verify's last segment is its join

    def total():
        return operations.progress_total(dynamo, store.load_state(mid))

    def done_before(run: int) -> int:
        return operations.done_items(store, mid, job, run)

    return [ProgressReporter(job, mid, segments, options.worker_count, total=total, done_before=done_before,
                             say=env.info, tty=is_tty() and not env.machine, interval=interval,
                             processes=options.processes),
            *job_metrics(env, job, mid, options, total, done_before)]
