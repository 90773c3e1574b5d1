"""Least-privilege IAM policies for reshard (pure: builds JSON-able dicts).

One table says what each command sends (:data:`COMMANDS`: command → table → actions →
partitions of the control table it may write); a role is a list of commands
(:data:`ROLES`), and its policy is the union of their needs. Four roles:

* ``app``: application instances importing the shim. What the shim's methods send to the
  data table (:data:`SHIM_METHODS`: single items, batches, queries, and ``scan()``'s Scan);
  reads of migration records and the table lock; writes only in its migration's heartbeat
  partition ``S#<id>``.
* ``observer``: ``plan``, ``status``, ``list``, ``doctor`` without ``--repair`` and
  ``verify --no-record``. Reads only: no write to any table. (A recorded verify writes
  its run in ``J#<id>#verify``, and that run opens the cutover gate: an observer allowed
  to write it could forge a passing verdict over wrong data.)
* ``worker``: the data jobs (:data:`JOBS`: ``backfill``, ``verify`` (recorded, the one the
  gate counts), ``verify --repair``, ``cleanup``, ``cleanup --strip-bookkeeping``): data-table
  writes and each job's partition ``J#<id>#<job>``. Never the phase row, history,
  heartbeats or lock.
* ``operator``: transitions (``start``, ``advance``, ``rollback``, ``abort``, the retire
  that ends the cleanup of an aborted migration), ``cleanup --enable-ttl``, ``doctor
  --repair``, the live control of a running job (``throttle``, ``pause``, ``resume``: a
  row in the operator's partition ``M#<id>``, which a worker cannot write, so a worker's
  credentials cannot lift a pause or a budget), and everything above.

Control-table writes are limited with ``dynamodb:LeadingKeys`` (the partition key of
every item a request touches), because the control table keys rows by who writes them
(:mod:`reshard.control.records`). What that cannot limit, by IAM's design: the sort key.
An app may overwrite or delete *another shim's heartbeat of the same migration*, which
can hide a lagging shim from the census; ``${aws:userid}`` in the key would confine each
principal to its own heartbeats, but instances of one role share a principal (Lambda, one
host's processes) and the census would then need a Scan. See docs/iam.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from reshard.core.phases import BACKFILL_JOB, CLEANUP_JOB, STRIP_JOB, VERIFY_JOB

DATA, CONTROL = "data", "control"
#: The table marker's partition key value (a string key; ``core/marker.py``): the only data
#: item the operator role writes.
MARKER_PARTITION = "_reshard#marker"

READ_DATA = ("DescribeTable", "Scan", "Query", "GetItem", "BatchGetItem")
WRITE_DATA = ("PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem")
READ_CONTROL = ("DescribeTable", "GetItem", "Query", "Scan")
WRITE_ROWS = ("PutItem", "UpdateItem", "DeleteItem")


@dataclass(frozen=True)
class Need:
    """Actions on one table; ``partitions``: LeadingKeys patterns (``{id}``, ``{table}``
    filled in), empty for "any item"."""

    table: str
    actions: tuple[str, ...]
    partitions: tuple[str, ...] = ()


#: What each public method of the shim (``ShardedTable``, its batch writer) sends to the data
#: table: the policy is made from this. ``tests/unit/test_iam_tables.py`` checks that every
#: public method of the shim is here; the request-recording test
#: (``tests/integration/test_iam_requests.py``) calls every one of them in every phase and
#: checks each request it records against this table and against the generated policy.
SHIM_METHODS: dict[str, tuple[str, ...]] = {
    # A random-suffix layout is found with a consistent BatchGetItem; a fenced write that
    # lost reads the stored version (GetItem); a write mirrors the result (PutItem).
    "get_item": ("GetItem", "BatchGetItem"),
    "batch_get_item": ("BatchGetItem", "GetItem"),
    "query": ("Query", "GetItem", "BatchGetItem"),  # a sharded GSI's entries resolved to items
    "scan": ("Scan", "GetItem", "BatchGetItem"),  # every live item once, at one designated copy
    "put_item": ("PutItem", "GetItem", "BatchGetItem"),
    "update_item": ("UpdateItem", "PutItem", "GetItem", "BatchGetItem"),
    "delete_item": ("DeleteItem", "PutItem", "GetItem", "BatchGetItem"),  # a tombstone is a PutItem
    "batch_writer": ("BatchWriteItem", "PutItem", "UpdateItem", "DeleteItem", "GetItem", "BatchGetItem"),
    # boto3's Table.load (and reload, and the description attributes, which load on first read).
    "load": ("DescribeTable",),
}

#: What each data job sends to the data table, by the job names of :mod:`reshard.core.phases`
#: (every job with a rule is here, a unit test checks), and the command that runs it. Each
#: job writes its own control partition ``J#<id>#<job>`` (runs, leases, budget rows, reports).
JOBS: dict[str, tuple[str, tuple[str, ...]]] = {
    # The copy is a PutItem; an index-only file's rewrite is an UpdateItem in place.
    BACKFILL_JOB: ("backfill", READ_DATA + ("PutItem", "UpdateItem")),
    VERIFY_JOB: ("verify", READ_DATA + ("DescribeTimeToLive",)),
    f"{VERIFY_JOB} --repair": ("verify --repair", READ_DATA + ("DescribeTimeToLive",) + WRITE_DATA),
    CLEANUP_JOB: ("cleanup", READ_DATA + ("DescribeTimeToLive", "UpdateItem", "DeleteItem")),
    # REMOVE of the bookkeeping attributes (UpdateItem), leftover tombstones deleted.
    STRIP_JOB: ("cleanup --strip-bookkeeping", READ_DATA + ("DescribeTimeToLive", "UpdateItem", "DeleteItem")),
}


def _job(job: str, data: tuple[str, ...]) -> tuple[Need, ...]:
    """A data job: read the control table, write its own job partition, the data table as given."""
    return (Need(DATA, data), Need(CONTROL, READ_CONTROL), Need(CONTROL, WRITE_ROWS, (f"J#{{id}}#{job}",)))


#: What the shim's refresh thread sends to the data table, whatever the app calls: the table
#: marker's key types (DescribeTable, once) and the marker itself (GetItem, every refresh).
SHIM_REFRESH: tuple[str, ...] = ("DescribeTable", "GetItem")


def _shim_data() -> tuple[str, ...]:
    return tuple(dict.fromkeys(a for actions in (*SHIM_METHODS.values(), SHIM_REFRESH) for a in actions))


#: command -> what it sends. The request-recording test (tests/integration/test_iam_requests.py)
#: runs the commands on dynalite and checks every request against the policies built from this.
COMMANDS: dict[str, tuple[Need, ...]] = {
    # The shim: data items (SHIM_METHODS; and the table marker: one GetItem per refresh, its key
    # types read once by DescribeTable); the migration's and (on a foreign lock or marker) another
    # migration's META row and the table lock; its own heartbeats.
    "shim": (Need(DATA, _shim_data()),
             Need(CONTROL, ("GetItem",), ("M#*", "T#{table}")),
             Need(CONTROL, ("PutItem", "DeleteItem"), ("S#{id}",))),
    "plan": (Need(DATA, ("DescribeTable", "DescribeTimeToLive", "Scan")),),
    "status": (Need(DATA, ("DescribeTable",)), Need(CONTROL, READ_CONTROL)),
    "list": (Need(CONTROL, READ_CONTROL),),
    "doctor": (Need(DATA, ("DescribeTable", "DescribeTimeToLive", "Scan", "GetItem")), Need(CONTROL, READ_CONTROL)),
    **{command: _job(job.split(" ")[0], data) for job, (command, data) in JOBS.items()},
    # Reads only: no lease, checkpoint, run or example (so it cannot open the cutover gate).
    "verify --no-record": (Need(DATA, READ_DATA + ("DescribeTimeToLive",)), Need(CONTROL, READ_CONTROL)),
    # Transitions: the phase row, history, table lock, and reaping silent heartbeats. `start`
    # also probes the server's signature check (GetItems, of the marker's key before the control
    # table exists) and claims the table marker; the retire (and doctor --repair) gives it back:
    # writes of the marker's partition only (docs/late-writes.md).
    "start": (Need(DATA, ("DescribeTable", "DescribeTimeToLive", "Scan", "GetItem")),  # plan's checks, --count
              Need(DATA, ("PutItem", "DeleteItem"), (MARKER_PARTITION,)),
              Need(CONTROL, READ_CONTROL + ("CreateTable",) + WRITE_ROWS)),
    "advance / rollback / abort": (Need(DATA, ("DescribeTable",)), Need(CONTROL, READ_CONTROL + WRITE_ROWS)),
    # Moves nothing: reads the census and the job leases, removes heartbeats it watched go silent.
    "wait": (Need(CONTROL, READ_CONTROL), Need(CONTROL, ("DeleteItem",), ("S#{id}", "M#{id}"))),
    "cleanup (retire of an aborted migration)": (Need(DATA, ("DescribeTable", "GetItem")),
                                                 Need(DATA, ("PutItem", "DeleteItem"), (MARKER_PARTITION,)),
                                                 Need(CONTROL, READ_CONTROL + WRITE_ROWS)),
    "cleanup --enable-ttl": (Need(DATA, ("DescribeTimeToLive", "UpdateTimeToLive")),),
    # Live control: the run's control row C#<job>#<run> in the operator's partition (workers read it).
    "throttle / pause / resume": (Need(CONTROL, READ_CONTROL), Need(CONTROL, ("PutItem",), ("M#{id}",))),
    "doctor --repair": (Need(DATA, ("DescribeTable", "Scan", "GetItem", "DeleteItem")),
                        Need(DATA, ("PutItem",), (MARKER_PARTITION,)),
                        Need(CONTROL, READ_CONTROL + WRITE_ROWS)),
}

#: The observer writes nothing: every command of it is read-only (a test checks).
_OBSERVER = ("plan", "status", "list", "doctor", "verify --no-record")
_WORKER = (*(command for command, _ in JOBS.values()), "status")
#: role -> the commands it may run (operator: every one, the shim's included).
ROLES: dict[str, tuple[str, ...]] = {
    "app": ("shim",),
    "observer": _OBSERVER,
    "worker": _WORKER,
    "operator": tuple(COMMANDS),
}


def table_arn(table: str, region: str = "*", account: str = "*") -> str:
    return f"arn:aws:dynamodb:{region}:{account}:table/{table}"


def grants(role: str, migration_id: str, data_table: str) -> dict[tuple[str, str], tuple[str, ...]]:
    """(table, action) -> LeadingKeys patterns, () meaning any partition; the union of the
    role's commands (an unrestricted grant of an action wins over restricted ones)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r} (one of {', '.join(ROLES)})")
    out: dict[tuple[str, str], set[str] | None] = {}
    for command in ROLES[role]:
        for need in COMMANDS[command]:
            parts = {p.format(id=migration_id, table=data_table) for p in need.partitions}
            for action in need.actions:
                key = (need.table, action)
                if not parts or (key in out and out[key] is None):
                    out[key] = None
                else:
                    out[key] = (out.get(key) or set()) | parts
    return {k: tuple(sorted(v)) if v else () for k, v in out.items()}


def policy(role: str, data_table: str, control_table: str, region: str = "*", account: str = "*",
           migration_id: str = "*", indexes: tuple[str, ...] = ()) -> dict:
    """The IAM policy document for ``role`` (``app``, ``observer``, ``worker`` or ``operator``).

    ``indexes``: GSIs of a sharded-index migration; a Query of one is authorized on the
    index's own ARN (``table/T/index/NAME``), so statements granting Query name those too.
    """
    statements: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (table, action), parts in grants(role, migration_id, data_table).items():
        statements.setdefault((table, parts), []).append(f"dynamodb:{action}")
    arns = {DATA: table_arn(data_table, region, account), CONTROL: table_arn(control_table, region, account)}
    out = []
    for n, ((table, parts), actions) in enumerate(sorted(statements.items()), 1):
        # Sids must be unique within a policy.
        st = {"Sid": f"Reshard{table.capitalize()}Table{'Partitions' if parts else ''}{n}", "Effect": "Allow",
              "Action": sorted(actions), "Resource": [arns[table]]}
        if table == DATA and "dynamodb:Query" in actions:
            st["Resource"] += [f"{arns[table]}/index/{name}" for name in indexes]
        if parts:
            # Every item a request touches must be in one of these partitions. Only item
            # actions carry keys: a Scan here would pass (ForAllValues of nothing is true).
            if {"dynamodb:Scan", "dynamodb:DescribeTable", "dynamodb:CreateTable"} & set(actions):
                raise ValueError(f"{actions} cannot be limited by partition")
            st["Condition"] = {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": list(parts)}}
        out.append(st)
    return {"Version": "2012-10-17", "Statement": out}


def summary(role: str) -> str:
    """One line: the commands a role may run."""
    return f"{role}: " + ", ".join(ROLES[role])
