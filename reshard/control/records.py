"""The control table's rows: their keys and their codecs.

One DynamoDB table (default ``reshard-control``, PAY_PER_REQUEST, partition key ``pk``
and sort key ``sk``, both strings)::

    pk              sk                          what                            written by
    M#<id>          META                        the migration: file text + hash, operator
                                                table, phase, phase_version
    M#<id>          H#<phase_version:08d>       one transition                  operator
    M#<id>          C#<job>#<run:06d>           a job run's live control: the   operator
                                                operator's budget, pause, and
                                                every change (who, when, old ->
                                                new); budget members read it
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
row of an unknown schema, one whose contents disagree with the key it sits under, or one
with an attribute of another type than reshard writes (:mod:`reshard.core.decode`, the
decoding layer every codec below goes through: times a row asks readers to wait are
clamped there to documented maxima).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from reshard import errors
from reshard.core.deadlines import clamp_horizon
from reshard.core import decode
from reshard.core.decode import MAX_LIVENESS_SECONDS, MAX_REQUEST_SECONDS, MAX_WRITE_SECONDS, quoted, safe_text
from reshard.core.leases import ASSUMED_MAX_REQUEST_SECONDS
from reshard.core.settle import assumed_write_seconds
from reshard.core.migration import Migration, parse, registered_changes
from reshard.core.phases import Phase, TERMINAL
from reshard.core.wire import N, S, get_n, get_s

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


def control_sk(job: str, run: int) -> str:
    """A job run's live-control row (``reshard throttle/pause/resume``), in the operator's partition."""
    return f"C#{job}#{run:06d}"


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
    we do not know: acting on it could move or hide a migration, so readers stop. Also every
    attribute reshard reads must have the type reshard writes it with
    (:func:`reshard.core.decode.check_types`): a ``pid`` stored as a string is refused here
    in one line, never a KeyError further on.
    """
    decode.check_keys(item)
    pk, sk = get_s(item, "pk", ""), get_s(item, "sk", "")
    where = decode.where(item)
    schema = item.get("schema")
    if schema is not None:
        value = schema.get("N") if isinstance(schema, dict) else None
        if value is None or not value.isdigit() or int(value) not in KNOWN_SCHEMAS:
            raise errors.ForeignControlRow(f"{where} has schema {_shown(schema)}, which this release does not know "
                                           f"(it writes {SCHEMA}): refusing to act on it; upgrade reshard, or "
                                           "remove the row if nobody should have written it")
    decode.check_types(item)
    kind, _, rest = pk.partition("#")
    if kind == "M" and sk == META:
        _same(where, "id", get_s(item, "id", ""), rest)
        if item.get("phase", {}).get("S") not in {p.value for p in Phase}:
            raise errors.ForeignControlRow(f"{where} has no valid phase: refusing to act on it")
    elif kind in ("M", "S") and sk.startswith("S#"):
        _same(where, "instance", get_s(item, "instance", ""), sk[2:])
    elif kind == "M" and sk.startswith("H#"):
        pass
    elif kind == "M" and sk.startswith("C#"):
        _same(where, "id", get_s(item, "id", ""), rest)
        job = sk[2:].rpartition("#")[0]
        if "job" in item:
            _same(where, "job", get_s(item, "job", ""), job)
    elif kind == "J":
        mid, _, job = rest.rpartition("#")
        if not mid or not sk.startswith(tuple(f"{p}#{job}#" for p in "RJUDB")):
            raise errors.ForeignControlRow(f"{where}: a job row that names another job than its partition's "
                                           f"({quoted(job)}): refusing to act on it")
        if "job" in item:
            _same(where, "job", get_s(item, "job", ""), job)
    elif kind == "T" and sk == TABLE_LOCK_SK:
        if not get_s(item, "migration_id", ""):
            raise errors.ForeignControlRow(f"{where}: a table lock without an owner: refusing to act on it")
    else:
        raise errors.ForeignControlRow(f"{where} is no row reshard writes: refusing to act on it")


def _same(where: str, attribute: str, found: str, expected: str) -> None:
    if found != expected:
        raise errors.ForeignControlRow(f"{where} says {attribute} {quoted(found)} but sits under {quoted(expected)} "
                                       "(forged, or copied from another row): refusing to act on it")


def _shown(value) -> str:
    return quoted(next(iter(value.values()))) if isinstance(value, dict) and value else quoted(value)


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
        check_row(i)
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
        """The migration file as registered (the control table is the source of truth); a
        ``shard_function`` is looked for where ``start`` read the file (its ``file_path``)."""
        return parse(self.file_text, f"control-table:{self.id}", origin=get_s(self.raw, "file_path", ""))

    def changes_from(self, m: Migration) -> list[str]:
        """How ``m`` differs in meaning from the registered file ([] when it means the same:
        comments, whitespace, key order, quoting and description are not meaning).

        Rows registered before the meaning hash existed hold only ``file_hash`` (of the
        bytes): the same bytes still match at once, and any other file is compared by
        parsing the registered text (:func:`reshard.core.migration.registered_changes`).
        """
        return registered_changes(m, self.file_text, self.file_hash, get_s(self.raw, "meaning_hash", ""))

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
    def previous_horizon(self) -> float:
        """The request horizon of the migration whose table marker this one replaced at ``start``
        (0 without one): its late requests may land for that long, so ``planned`` lasts it."""
        raw = self.raw.get("previous_horizon", {}).get("N")
        try:
            return clamp_horizon(float(raw)) if raw is not None else 0.0
        except ValueError:
            return clamp_horizon(None)

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
    #: Why this row could not be decoded (:meth:`unreadable_row`); "" for a readable row.
    unreadable: str = ""
    #: An unreadable row's content fingerprint: it changes whenever anyone rewrites the row.
    fingerprint: str = ""
    #: An unreadable row as read (a removal is conditioned on it being still the same).
    raw: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def token(self) -> tuple:
        """What changes with every heartbeat (``at`` too, for rows written before ``beat``;
        an unreadable row's whole content)."""
        return (self.beat, self.at, self.fingerprint)

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
        if self.unreadable:
            return (f"an unreadable heartbeat row {quoted(self.row_pk)}/{quoted('S#' + self.instance)} "
                    f"({self.unreadable}; counted as a lagging shim until it stays unchanged for "
                    f"{self.silence_seconds:g}s: `reshard doctor` shows it)")
        return f"{safe_text(self.instance)} ({safe_text(self.host)} pid {self.pid}, on {safe_text(self.phase)} " \
               f"v{self.phase_version})"

    def describe_foreign(self) -> str:
        if self.unreadable:
            return self.describe()
        return (f"{safe_text(self.instance)} ({safe_text(self.host)} pid {self.pid}, runs migration "
                f"{quoted(self.migration_id)}, on {safe_text(self.phase)} v{self.phase_version})")

    def as_dict(self, now: float, live: bool) -> dict:
        """For status; ``seconds_ago`` is by the shim's clock against ours (skew included)."""
        out = {"instance": self.instance, "host": self.host, "pid": self.pid, "phase": self.phase,
               "phase_version": self.phase_version, "seconds_ago": round(now - self.at, 1), "live": live}
        if self.unreadable:
            out.update(seconds_ago=None, unreadable=self.unreadable)
        return out

    @classmethod
    def from_item(cls, i: dict) -> "Heartbeat":
        check_row(i)
        # The waits a heartbeat asks for are clamped to reshard's bounds (reshard.core.decode):
        # a liveness of 1E+125 would make its shim impossible to watch go silent.
        return cls(get_s(i, "instance"), get_s(i, "host", "?"), int(get_n(i, "pid", 0)), get_s(i, "phase", "?"),
                   int(get_n(i, "phase_version", 0)), float(get_n(i, "at", 0)),
                   decode.seconds(get_n(i, "liveness_seconds"), MAX_LIVENESS_SECONDS, DEFAULT_LIVENESS_SECONDS),
                   decode.seconds(get_n(i, "refresh_seconds"), MAX_LIVENESS_SECONDS), get_s(i, "pk", "M#")[2:],
                   int(get_n(i, "beat", 0)), decode.seconds(get_n(i, "request_seconds"), MAX_REQUEST_SECONDS),
                   get_s(i, "pk", ""), decode.seconds(get_n(i, "write_seconds"), MAX_WRITE_SECONDS))

    @classmethod
    def unreadable_row(cls, i: dict, reason: str) -> "Heartbeat":
        """A heartbeat row that failed :func:`check_row`, as the census counts it: a shim that
        lags every version (fail closed: it may be a shim of a newer release), live until its
        whole content stayed unchanged for the longest any shim may be silent -- so a row
        nobody rewrites stops holding the fleet back after that, and one rewritten with every
        beat keeps counting, like any live shim."""
        pk = i["pk"]["S"] if isinstance(i.get("pk"), dict) and isinstance(i["pk"].get("S"), str) else "?"
        sk = i["sk"]["S"] if isinstance(i.get("sk"), dict) and isinstance(i["sk"].get("S"), str) else "S#?"
        return cls(sk[2:], "?", 0, "?", -1, 0.0, MAX_LIVENESS_SECONDS, 0.0, pk[2:], 0, MAX_REQUEST_SECONDS, pk,
                   MAX_WRITE_SECONDS, unreadable=reason, fingerprint=decode.digest(i), raw=dict(i))


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
        if not run.isdigit():
            raise errors.ForeignControlRow(f"{decode.where(item)}: a run row whose run number {quoted(run)} is not "
                                           "a number: refusing to act on it")
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


# --------------------------------------------------------------------------- live control of a job run

#: The changes a run's control row keeps (the oldest drop off; ``status`` shows the last few).
CONTROL_CHANGES_KEPT = 50
#: The fields of a run's control row an operator sets, as ``reshard throttle/pause`` name them.
CONTROL_FIELDS = ("max_wcu", "max_rcu", "paused", "release_leases")


def _bad(item: dict, why: str) -> errors.ForeignControlRow:
    where = f"control row ({get_s(item, 'pk', '')!r}, {get_s(item, 'sk', '')!r})"
    return errors.ForeignControlRow(f"{where} {why}: refusing to act on it")


def _typed(item: dict, attr: str, kind: str, what: str):
    """``item[attr]`` of wire type ``kind`` (None when absent); a wrong type is a foreign row."""
    if attr not in item:
        return None
    value = item[attr]
    if not isinstance(value, dict) or kind not in value:
        raise _bad(item, f"has {attr} of the wrong type (expected {what})")
    return value[kind]


def _capacity(item: dict, attr: str) -> float | None:
    text = _typed(item, attr, "N", "a number")
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise _bad(item, f"has {attr} {text!r}, not a number") from None
    if not 0 < value < 1e9:  # a budget in units/s: positive and finite
        raise _bad(item, f"has {attr} {text}, outside (0, 1e9) units/s")
    return value


def _shown_value(field: str, value) -> str:
    if field == "paused":
        return "paused" if value else "running"
    if field == "release_leases":
        return "leases released" if value else "leases kept"
    return "(each process's own option)" if value is None else f"{value:g}"


@dataclass(frozen=True)
class ControlChange:
    """One recorded change of a run's control: who, when, and each field's old and new value."""

    version: int
    action: str  # throttle | pause | resume
    who: str
    at: float
    before: dict
    after: dict

    def text(self) -> str:
        """``max_wcu 40 -> 10`` (one clause per field that changed)."""
        return ", ".join(f"{k} {_shown_value(k, self.before.get(k))} -> {_shown_value(k, self.after.get(k))}"
                         if k in ("max_wcu", "max_rcu") else _shown_value(k, self.after.get(k))
                         for k in CONTROL_FIELDS if k in self.after) or "no change"

    def as_dict(self) -> dict:
        return {"version": self.version, "action": self.action, "who": self.who, "at": self.at,
                "before": dict(self.before), "after": dict(self.after), "text": self.text()}

    def to_wire(self) -> dict:
        def fields(d: dict) -> dict:
            return {"M": {k: ({"NULL": True} if v is None else {"BOOL": v} if isinstance(v, bool) else N(v))
                          for k, v in d.items()}}
        return {"M": {"version": N(self.version), "action": S(self.action), "who": S(self.who), "at": N(self.at),
                      "before": fields(self.before), "after": fields(self.after)}}

    @classmethod
    def from_wire(cls, row: dict, value) -> "ControlChange":
        m = value.get("M") if isinstance(value, dict) else None
        if not isinstance(m, dict):
            raise _bad(row, "has a change that is not a map")

        def fields(name: str) -> dict:
            out = {}
            for k, v in (m.get(name, {}).get("M") or {}).items():
                if k not in CONTROL_FIELDS or not isinstance(v, dict):
                    raise _bad(row, f"has a change of an unknown field {k!r}")
                out[k] = None if "NULL" in v else v["BOOL"] if "BOOL" in v else float(v.get("N", "nan"))
            return out
        try:
            return cls(int(m["version"]["N"]), m["action"]["S"], m["who"]["S"], float(m["at"]["N"]),
                       fields("before"), fields("after"))
        except (KeyError, TypeError, ValueError):
            raise _bad(row, "has a change without version, action, who or at") from None


@dataclass(frozen=True)
class Hold:
    """A paused run as its workers see it: no data write until ``reshard resume``."""

    migration_id: str
    by: str
    since: float
    release_leases: bool = False

    def summary(self) -> str:
        """Who paused it, when, and what became of its leases."""
        leases = ("its segment leases released (any process may take them once resumed)" if self.release_leases
                  else "its segment leases kept and renewed")
        when = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(self.since)) if self.since else "?"
        return f"paused by {self.by} at {when}, {leases}"

    def reason(self) -> str:
        """Why the job sends nothing (its progress line, the metrics' hold reason)."""
        return f"{self.summary()}: `reshard resume {self.migration_id}` lets it go on"


@dataclass(frozen=True)
class RunControl:
    """A job run's live control (``M#<id>`` / ``C#<job>#<run>``), written only by ``reshard
    throttle/pause/resume`` (compare-and-set on ``version``) and read by every budget member of
    the run at each beat: the budget the operator set (None: the processes' own ``--max-wcu`` /
    ``--max-rcu``), whether the run is paused and whether a pause releases the leases, and the
    last :data:`CONTROL_CHANGES_KEPT` changes."""

    migration_id: str
    job: str
    run: int
    version: int = 0
    max_wcu: float | None = None
    max_rcu: float | None = None
    paused: bool = False
    release_leases: bool = False
    updated_by: str = ""
    updated_at: float = 0.0
    changes: tuple = ()

    @property
    def totals(self) -> dict:
        """lane -> the operator's budget (None: the lane follows the processes' own options)."""
        return {"write": self.max_wcu, "read": self.max_rcu}

    @property
    def hold(self) -> Hold | None:
        if not self.paused:
            return None
        since = next((c.at for c in reversed(self.changes) if c.after.get("paused")), self.updated_at)
        by = next((c.who for c in reversed(self.changes) if c.after.get("paused")), self.updated_by)
        return Hold(self.migration_id, by, since, self.release_leases)

    def set_by(self, field: str) -> str:
        """Who last changed ``field`` ("" if nobody)."""
        return next((c.who for c in reversed(self.changes) if field in c.after), "")

    def values(self) -> dict:
        """The fields an operator sets, as they are now."""
        return {k: getattr(self, k) for k in CONTROL_FIELDS}

    def as_dict(self) -> dict:
        return {**self.values(), "version": self.version, "updated_by": self.updated_by or None,
                "updated_at": self.updated_at or None, "changes": [c.as_dict() for c in self.changes]}

    def to_item(self) -> dict:
        item = {"pk": S(migration_pk(self.migration_id)), "sk": S(control_sk(self.job, self.run)),
                "id": S(self.migration_id), "job": S(self.job), "run": N(self.run), "version": N(self.version),
                "paused": {"BOOL": self.paused}, "release_leases": {"BOOL": self.release_leases},
                "updated_by": S(self.updated_by), "updated_at": N(self.updated_at),
                "changes": {"L": [c.to_wire() for c in self.changes[-CONTROL_CHANGES_KEPT:]]}}
        for attr in ("max_wcu", "max_rcu"):
            if getattr(self, attr) is not None:
                item[attr] = N(float(getattr(self, attr)))
        return item

    @classmethod
    def from_item(cls, item: dict) -> "RunControl":
        """Decode a control row, every field's type and bounds checked (a wrong one: ForeignControlRow)."""
        check_row(item)
        sk = get_s(item, "sk", "")
        job, _, run = sk[2:].rpartition("#")
        version = _typed(item, "version", "N", "a number")
        if not run.isdigit() or version is None or not str(version).isdigit():
            raise _bad(item, "has no valid run or version")
        changes = _typed(item, "changes", "L", "a list") or []
        return cls(get_s(item, "id"), job, int(run), int(version), _capacity(item, "max_wcu"),
                   _capacity(item, "max_rcu"), bool(_typed(item, "paused", "BOOL", "a boolean")),
                   bool(_typed(item, "release_leases", "BOOL", "a boolean")),
                   _typed(item, "updated_by", "S", "a string") or "",
                   float(_typed(item, "updated_at", "N", "a number") or 0),
                   tuple(ControlChange.from_wire(item, c) for c in changes))
