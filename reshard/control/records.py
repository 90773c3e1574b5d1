"""The control table's rows: their keys and their codecs.

One DynamoDB table (default ``reshard-control``, PAY_PER_REQUEST, partition key ``pk``
and sort key ``sk``, both strings)::

    pk              sk                          what                            written by
    M#<id>          META                        the migration: file text + hash, operator
                                                table, phase, phase_version
    M#<id>          H#<phase_version:08d>       one transition                  operator
    S#<id>          S#<instance id>             a shim heartbeat: host, pid,    app (shim)
                                                phase_version it acts on, beat
    J#<id>#<job>    R#<job>#<run:06d>           a job run: started/finished     worker
    J#<id>#<job>    J#<job>#<run:06d>#<seg:05d> a job segment: lease, checkpoint worker
    J#<id>#<job>    U#<job>#<digest>            an unmappable item found        worker
    J#<id>#<job>    D#<job>#<run:06d>#<digest>  an example difference (verify)  worker
    J#<id>#<job>    B#<job>#<run:06d>           the run's capacity budget and   worker
                                                each member's share
    J#<id>#<job>    B#<job>#<run:06d>#<member>  a budget member's beat          worker
    T#<table>       ACTIVE                      which migration owns the table  operator

The partition says who may write a row: IAM's ``dynamodb:LeadingKeys`` condition sees
only the partition key, so the app's policy can allow writes to ``S#<id>`` (heartbeats)
and nothing else, a worker's to ``J#<id>#<job>`` and never the phase row
(:mod:`reshard.core.iam`). Heartbeats once lived in ``M#<id>``: the census still reads
that place too, so a shim of an older release is counted (fail closed).

Every row reshard writes carries ``schema`` (:data:`SCHEMA`); :func:`check_row` refuses a
row of an unknown schema or one whose contents disagree with the key it sits under.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reshard import errors
from reshard.core.deadlines import clamp_horizon
from reshard.core.leases import ASSUMED_MAX_REQUEST_SECONDS
from reshard.core.settle import assumed_write_seconds
from reshard.core.migration import Migration, parse
from reshard.core.phases import Phase, TERMINAL
from reshard.core.wire import get_n, get_s

META = "META"
#: The row format this release writes (attribute ``schema``); a row without it was written
#: before the attribute existed and has the same format (1).
SCHEMA = 1
KNOWN_SCHEMAS = frozenset({1})
#: A shim refuses to act once it could not refresh for this long (seconds).
DEFAULT_LIVENESS_SECONDS = 30.0
#: For heartbeats written before shims reported it: the same assumption as for job leases
#: (the choke point's default connect + read timeout, one attempt's longest flight).
ASSUMED_SHIM_REQUEST_SECONDS = ASSUMED_MAX_REQUEST_SECONDS


# --------------------------------------------------------------------------- keys

def migration_pk(migration_id: str) -> str:
    return f"M#{migration_id}"


def history_sk(phase_version: int) -> str:
    return f"H#{phase_version:08d}"


def heartbeat_pk(migration_id: str) -> str:
    """The shims' partition of a migration (the only one an app may write)."""
    return f"S#{migration_id}"


def jobs_pk(migration_id: str, job: str) -> str:
    """A job's partition (runs, segments, unmappable items, examples): a worker writes here."""
    return f"J#{migration_id}#{job}"


def shim_sk(instance: str) -> str:
    return f"S#{instance}"


def run_sk(job: str, run: int) -> str:
    return f"R#{job}#{run:06d}"


def segment_prefix(job: str, run: int) -> str:
    return f"J#{job}#{run:06d}#"


def segment_sk(job: str, run: int, segment: int) -> str:
    return f"{segment_prefix(job, run)}{segment:05d}"


def unmappable_sk(job: str, digest: str) -> str:
    return f"U#{job}#{digest}"


def example_prefix(job: str, run: int) -> str:
    return f"D#{job}#{run:06d}#"


def table_lock_pk(table: str) -> str:
    return f"T#{table}"


TABLE_LOCK_SK = "ACTIVE"


# --------------------------------------------------------------------------- row check

def check_row(item: dict) -> None:
    """Refuse a control row reshard did not write: raise :class:`~reshard.errors.ForeignControlRow`.

    Pure (``doctor`` calls it on every row). Checks the ``schema`` version and that what the
    row says about itself matches the key it sits under: a META row names its own
    migration, a heartbeat its own instance, a job row its partition's job, the table lock
    a migration. A row that fails was forged, or written by a newer release whose format
    we do not know: acting on it could move or hide a migration, so readers stop.
    """
    pk, sk = get_s(item, "pk", ""), get_s(item, "sk", "")
    where = f"control row ({pk!r}, {sk!r})"
    schema = item.get("schema")
    if schema is not None:
        value = schema.get("N") if isinstance(schema, dict) else None
        if value is None or not value.isdigit() or int(value) not in KNOWN_SCHEMAS:
            raise errors.ForeignControlRow(f"{where} has schema {_shown(schema)}, which this release does not know "
                                           f"(it writes {SCHEMA}): refusing to act on it; upgrade reshard, or "
                                           "remove the row if nobody should have written it")
    kind, _, rest = pk.partition("#")
    if kind == "M" and sk == META:
        _same(where, "id", get_s(item, "id", ""), rest)
        if item.get("phase", {}).get("S") not in {p.value for p in Phase}:
            raise errors.ForeignControlRow(f"{where} has no valid phase: refusing to act on it")
    elif kind in ("M", "S") and sk.startswith("S#"):
        _same(where, "instance", get_s(item, "instance", ""), sk[2:])
    elif kind == "M" and sk.startswith("H#"):
        pass
    elif kind == "J":
        mid, _, job = rest.rpartition("#")
        if not mid or not sk.startswith(tuple(f"{p}#{job}#" for p in "RJUDB")):
            raise errors.ForeignControlRow(f"{where}: a job row that names another job than its partition's "
                                           f"({job!r}): refusing to act on it")
        if "job" in item:
            _same(where, "job", get_s(item, "job", ""), job)
    elif kind == "T" and sk == TABLE_LOCK_SK:
        if not get_s(item, "migration_id", ""):
            raise errors.ForeignControlRow(f"{where}: a table lock without an owner: refusing to act on it")
    else:
        raise errors.ForeignControlRow(f"{where} is no row reshard writes: refusing to act on it")


def _same(where: str, attribute: str, found: str, expected: str) -> None:
    if found != expected:
        raise errors.ForeignControlRow(f"{where} says {attribute} {found!r} but sits under {expected!r} "
                                       "(forged, or copied from another row): refusing to act on it")


def _shown(value) -> str:
    return repr(next(iter(value.values()))) if isinstance(value, dict) and value else repr(value)


# --------------------------------------------------------------------------- rows

@dataclass(frozen=True)
class Transition:
    """One recorded phase change."""

    phase_version: int
    from_phase: str
    to_phase: str
    action: str
    who: str
    at: float

    def as_dict(self) -> dict:
        return {"phase_version": self.phase_version, "from": self.from_phase, "to": self.to_phase,
                "action": self.action, "who": self.who, "at": self.at}

    @classmethod
    def from_item(cls, i: dict) -> "Transition":
        return cls(int(get_n(i, "phase_version", 0)), get_s(i, "from", ""), get_s(i, "to", ""),
                   get_s(i, "action", ""), get_s(i, "who", "?"), float(get_n(i, "at", 0)))


@dataclass(frozen=True)
class MigrationState:
    """The META record of a migration, parsed."""

    id: str
    table: str
    phase: Phase
    phase_version: int
    file_text: str
    file_hash: str
    created_at: float
    created_by: str
    updated_at: float
    last: Transition | None
    raw: dict = field(repr=False, default_factory=dict)

    def migration(self) -> Migration:
        """The migration file as registered (the control table is the source of truth)."""
        return parse(self.file_text, f"control-table:{self.id}")

    @property
    def retired(self) -> bool:
        """An aborted migration whose cleanup pass finished: shims serve the old layout as steady state."""
        return bool(self.raw.get("retired", {}).get("BOOL", False))

    @property
    def switching(self) -> bool:
        """The fleet is switching authority into ``phase`` (shims hold requests until it is over)."""
        return bool(self.raw.get("switching", {}).get("BOOL", False))

    # -- the request horizon (docs/late-writes.md); written by `start` and by each transition
    @property
    def request_horizon(self) -> float:
        """``H``: how long after the control read it obeys DynamoDB still accepts a data request
        of this migration (clamped to documented bounds; the default for rows without it)."""
        raw = self.raw.get("request_horizon", {}).get("N")
        try:
            return clamp_horizon(float(raw)) if raw is not None else clamp_horizon(None)
        except ValueError:
            return clamp_horizon(None)

    @property
    def server_deadline(self) -> bool:
        """Whether the server was found to enforce the signature window (``start``'s probe);
        False for rows without it and for ``--no-server-deadline`` (test servers): nothing then
        waits on the horizon."""
        return self.raw.get("server_deadline", {}).get("S") == "enforced"

    @property
    def phase_since(self) -> float | None:
        """The server's clock (epoch seconds) when the current phase (or switch) began, as the
        transition's answer dated it; None if not recorded (the reader then counts from its own
        first sight of this phase version)."""
        raw = self.raw.get("phase_since", {}).get("N")
        try:
            return float(raw) if raw is not None else None
        except ValueError:
            return None

    @property
    def newer_may_be(self) -> str | None:
        """Catch-up after an authority switch: ``"old"`` or ``"new"``, the layout that may hold a
        newer copy than the authoritative one (a lost mirror); None when a verify cleared it."""
        v = self.raw.get("newer_may_be", {}).get("S")
        return v if v in ("old", "new") else None

    @property
    def active(self) -> bool:
        """Still owns its table: not complete, and not aborted-and-cleaned-up."""
        if self.phase is Phase.ABORTED:
            return not self.retired
        return self.phase not in TERMINAL

    @classmethod
    def from_item(cls, item: dict) -> "MigrationState":
        check_row(item)
        version = int(get_n(item, "phase_version"))
        last = None
        if "last_to" in item:
            last = Transition(version, get_s(item, "last_from", ""), get_s(item, "last_to"),
                              get_s(item, "last_action", ""), get_s(item, "updated_by", "?"),
                              float(get_n(item, "updated_at", 0)))
        return cls(id=get_s(item, "id"), table=get_s(item, "table"), phase=Phase(get_s(item, "phase")),
                   phase_version=version, file_text=get_s(item, "file_text"), file_hash=get_s(item, "file_hash"),
                   created_at=float(get_n(item, "created_at", 0)), created_by=get_s(item, "created_by", "?"),
                   updated_at=float(get_n(item, "updated_at", 0)), last=last, raw=item)


@dataclass(frozen=True)
class Heartbeat:
    """One shim instance's last report.

    Liveness is not judged from ``at`` (the shim's wall clock; shown, never compared):
    the census watches ``beat``, a counter the shim bumps with every heartbeat, on the
    judging host's own clock (:func:`reshard.control.fleet.census`).
    """

    instance: str
    host: str
    pid: int
    phase: str
    phase_version: int
    at: float
    liveness_seconds: float
    refresh_seconds: float = 0.0  # how often it re-reads the phase (0: not reported)
    migration_id: str = ""  # the migration whose file the shim runs
    beat: int = 0  # bumped by every heartbeat of this instance
    request_seconds: float = 0.0  # the longest one attempt of its requests can be in flight (0: not reported)
    row_pk: str = ""  # the partition it was read from (S#<id>; M#<id> for a shim of an older release)
    #: The longest one of its writes can still be completing after its authoritative copy
    #: landed (the mirror and every retry; 0: not reported): verify's settle window.
    write_seconds: float = 0.0

    @property
    def token(self) -> tuple:
        """What changes with every heartbeat (``at`` too, for rows written before ``beat``)."""
        return (self.beat, self.at)

    @property
    def silence_seconds(self) -> float:
        """How long the census must see :attr:`token` unchanged before it calls the shim gone.

        The shim stops sending (every attempt checks) once its last successful refresh
        is ``liveness_seconds`` old on its own clock; an attempt sent just before lands
        within ``request_seconds``. The census's timer starts only after it read the
        heartbeat, which is after the shim started that refresh, so once the token has
        been unchanged this long nothing the shim sent can still land.
        """
        return self.liveness_seconds + (self.request_seconds or ASSUMED_SHIM_REQUEST_SECONDS)

    @property
    def settle_seconds(self) -> float:
        """This shim's write bound (:mod:`reshard.core.settle`), assumed if it did not say."""
        return self.write_seconds or assumed_write_seconds(self.request_seconds)

    def describe(self) -> str:
        return f"{self.instance} ({self.host} pid {self.pid}, on {self.phase} v{self.phase_version})"

    def describe_foreign(self) -> str:
        return (f"{self.instance} ({self.host} pid {self.pid}, runs migration {self.migration_id!r}, on {self.phase} "
                f"v{self.phase_version})")

    def as_dict(self, now: float, live: bool) -> dict:
        """For status; ``seconds_ago`` is by the shim's clock against ours (skew included)."""
        return {"instance": self.instance, "host": self.host, "pid": self.pid, "phase": self.phase,
                "phase_version": self.phase_version, "seconds_ago": round(now - self.at, 1), "live": live}

    @classmethod
    def from_item(cls, i: dict) -> "Heartbeat":
        check_row(i)
        return cls(get_s(i, "instance"), get_s(i, "host", "?"), int(get_n(i, "pid", 0)), get_s(i, "phase", "?"),
                   int(get_n(i, "phase_version", 0)), float(get_n(i, "at", 0)),
                   float(get_n(i, "liveness_seconds", DEFAULT_LIVENESS_SECONDS)),
                   float(get_n(i, "refresh_seconds", 0.0)), get_s(i, "pk", "M#")[2:],
                   int(get_n(i, "beat", 0)), float(get_n(i, "request_seconds", 0.0)), get_s(i, "pk", ""),
                   float(get_n(i, "write_seconds", 0.0)))


@dataclass(frozen=True)
class RunInfo:
    """A job run's record: when it started and finished, and how it was split."""

    migration_id: str
    job: str
    run: int
    total_segments: int
    started_at: float
    finished_at: float | None
    totals: dict = field(default_factory=dict, compare=False)
    #: Stamped by ``reshard doctor --repair`` on a run that can never finish (shown, never gating).
    abandoned_at: float | None = None
    #: The migration's phase version the run was started in (None: a run of an earlier release).
    phase_version: int | None = None

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @classmethod
    def from_item(cls, migration_id: str, item: dict) -> "RunInfo":
        check_row(item)
        _, job, run = get_s(item, "sk").split("#", 2)
        fin = get_n(item, "finished_at")
        abandoned = get_n(item, "abandoned_at")
        totals = {k: float(v["N"]) for k, v in item.get("totals", {}).get("M", {}).items()}
        if "repair_pages" in item:
            # verify's pages that sent a repair, counted on the run row before the first one
            # (``runner.announce_repair``): a redone page's counters can miss them.
            totals["repair_pages"] = max(totals.get("repair_pages", 0.0), float(get_n(item, "repair_pages")))
        pv = get_n(item, "phase_version")
        return cls(migration_id, job, int(run), int(get_n(item, "total_segments", 0)),
                   float(get_n(item, "started_at", 0)), float(fin) if fin is not None else None, totals,
                   float(abandoned) if abandoned is not None else None, int(pv) if pv is not None else None)
