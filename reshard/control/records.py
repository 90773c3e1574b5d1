"""The control table's rows: their keys and their codecs.

One DynamoDB table (default ``reshard-control``, PAY_PER_REQUEST, partition key ``pk``
and sort key ``sk``, both strings)::

    pk              sk                          what
    M#<id>          META                        the migration: file text + hash, table,
                                                phase, phase_version, last transition
    M#<id>          H#<phase_version:08d>       one transition: from, to, action, who, at
    M#<id>          S#<instance id>             a shim heartbeat: host, pid, phase and
                                                phase_version it acts on, at, liveness
    M#<id>          R#<job>#<run:06d>           a job run: started/finished, totals
    M#<id>          J#<job>#<run:06d>#<seg:05d> a job segment: lease and checkpoint
    M#<id>          U#<job>#<digest>            an unmappable item found by a job
    M#<id>          D#<job>#<run:06d>#<digest>  an example difference found by verify
    T#<table>       ACTIVE                      which migration owns a data table now

Everything about one migration shares a partition, so ``status`` is one Query.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reshard.core.leases import ASSUMED_MAX_REQUEST_SECONDS
from reshard.core.settle import assumed_write_seconds
from reshard.core.migration import Migration, parse
from reshard.core.phases import Phase, TERMINAL
from reshard.core.wire import get_n, get_s

META = "META"
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

    @property
    def active(self) -> bool:
        """Still owns its table: not complete, and not aborted-and-cleaned-up."""
        if self.phase is Phase.ABORTED:
            return not self.retired
        return self.phase not in TERMINAL

    @classmethod
    def from_item(cls, item: dict) -> "MigrationState":
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
        return cls(get_s(i, "instance"), get_s(i, "host", "?"), int(get_n(i, "pid", 0)), get_s(i, "phase", "?"),
                   int(get_n(i, "phase_version", 0)), float(get_n(i, "at", 0)),
                   float(get_n(i, "liveness_seconds", DEFAULT_LIVENESS_SECONDS)),
                   float(get_n(i, "refresh_seconds", 0.0)), get_s(i, "pk", "M#")[2:],
                   int(get_n(i, "beat", 0)), float(get_n(i, "request_seconds", 0.0)),
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

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @classmethod
    def from_item(cls, migration_id: str, item: dict) -> "RunInfo":
        _, job, run = get_s(item, "sk").split("#", 2)
        fin = get_n(item, "finished_at")
        abandoned = get_n(item, "abandoned_at")
        totals = {k: float(v["N"]) for k, v in item.get("totals", {}).get("M", {}).items()}
        return cls(migration_id, job, int(run), int(get_n(item, "total_segments", 0)),
                   float(get_n(item, "started_at", 0)), float(fin) if fin is not None else None, totals,
                   float(abandoned) if abandoned is not None else None)
