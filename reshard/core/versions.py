"""Write versions, version fences, and the copy step shared by the shim and the backfill.

Pure domain module.

Version scheme
    Every write through the shim stamps the item with ``_rs_v``, a string
    ``"<13-digit unix ms>.<6-digit counter>.<writer id>"``. Fixed widths make string
    order equal to (time, counter, writer) order, and DynamoDB compares strings in
    condition expressions, so a *fence* is one condition:
    ``attribute_not_exists(_rs_v) OR _rs_v < :v``. An item without ``_rs_v`` was
    written before the migration and counts as oldest.

    The clock is a hybrid logical clock: it never goes backwards within a process, and
    when a fenced write finds a newer version (another host's clock runs ahead), the
    writer *observes* that version and retries above it. Versions of one item thus grow
    with every write acknowledged on its authoritative copy, and mirror copies converge
    to the highest version -- the last acknowledged write.

A stored version is input
    Any client that can write the data table can write ``_rs_v``. A writer adopts a
    stored version only after :func:`check_version`: a string of the exact format above
    (the writer id 1-64 printable ASCII characters without '.'), at most
    :data:`MAX_AHEAD_MS` ahead of the writer's clock (``now_ms``, an argument: the server's
    clock may be passed instead). Anything else (``"9999999999999.999999.zz"``, a number, a
    list, 10 KB of text) raises :class:`~reshard.errors.BadVersion` naming the item and the
    value: the shim refuses *that item's* write with it (the application sees a
    ``ValidationException``), every other item and every other shim go on, and the clock
    never moves. Adopting it would have pushed the clock past every real version (a 13-digit
    millisecond count overflowing to 14 digits sorts *below* them all: every later fenced
    write lost) and spread the forged time to every shim writing the item. Readers never
    raise: :func:`version_of` gives a non-string ``_rs_v`` as ``""`` (oldest), so reads, a
    backfill copy's fence and verify's comparison treat it as a foreign write.

The copy step
    The backfill copies each old item with one PutItem fenced by :func:`copy_fence`:
    onto nothing or an older version only, so a newer write at the new key (a shim's
    mirror write, a delete's tombstone, a newer old copy of the same logical item)
    always stays. When that fence fails, :func:`copy_outcome` says what the target
    holds: something newer (keep it), the same content (nothing to do), or another
    *unversioned* old copy with different content -- a *collision* that is reported,
    never silently resolved. :func:`copy_action` is the read-back step of the copy
    before it was fenced; no reshard code calls it any more (the shim model test's
    ``tests/copy_model.py`` still replays that older copy).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from reshard import errors
from reshard.core.decode import quoted
from reshard.core.layout import SOURCE_ATTR, TOMBSTONE_ATTR, VERSION_ATTR

_MS_WIDTH = 13
_COUNTER_WIDTH = 6
_COUNTER_MAX = 10 ** _COUNTER_WIDTH - 1
_MS_MAX = 10 ** _MS_WIDTH - 1  # 2286-11-20: past it a version would need 14 digits and sort low
#: A writer id: printable ASCII without '.' (the separator) or blanks, as long as this at most.
MAX_WRITER_CHARS = 64
_WRITER = r"[\x21-\x2d\x2f-\x7e]{1,%d}" % MAX_WRITER_CHARS
_VERSION_RE = re.compile(r"(\d{%d})\.(\d{%d})\.(%s)" % (_MS_WIDTH, _COUNTER_WIDTH, _WRITER))
_WRITER_RE = re.compile(_WRITER)
#: How far ahead of a writer's clock a stored version may be and still be adopted. AWS
#: refuses a request signed more than 5 minutes away from its own clock (SigV4, as users
#: observe it), so every writer that reached DynamoDB is within 5 minutes of AWS, and two
#: writers within 10 minutes of each other; a version further ahead came from no such writer.
MAX_AHEAD_MS = 10 * 60 * 1000


def now_ms() -> int:
    """This host's wall clock in milliseconds (what a :class:`VersionClock` stamps)."""
    return time.time_ns() // 1_000_000


def parse_version(version: str) -> tuple[int, int, str]:
    """``(ms, counter, writer)`` of a well-formed version; :class:`~reshard.errors.BadVersion` else."""
    m = _VERSION_RE.fullmatch(version) if isinstance(version, str) else None
    if m is None:
        raise errors.BadVersion(f"{VERSION_ATTR} {quoted(version)} is not a version reshard writes "
                                f"('<13-digit ms>.<6-digit counter>.<writer id>')")
    return int(m.group(1)), int(m.group(2)), m.group(3)


def version_ms(version: str) -> int | None:
    """The wall time (ms) of a well-formed version; None for anything else (a reader that
    judges an item by its version's time leaves an item it cannot judge alone)."""
    m = _VERSION_RE.fullmatch(version) if isinstance(version, str) else None
    return int(m.group(1)) if m else None


def check_version(version: str, now: int, ahead_ms: int = MAX_AHEAD_MS) -> tuple[int, int, str]:
    """:func:`parse_version`, and refuse a version more than ``ahead_ms`` ahead of ``now``
    (milliseconds: this host's clock, or the server's). Pure."""
    ms, counter, writer = parse_version(version)
    if ms > now + ahead_ms:
        raise errors.BadVersion(f"{VERSION_ATTR} {quoted(version)} is {(ms - now) / 1000:.0f}s ahead of this "
                                f"writer's clock, beyond the {ahead_ms / 60000:g}-minute skew bound")
    return ms, counter, writer


def format_version(ms: int, counter: int, writer: str) -> str:
    if not 0 <= ms <= _MS_MAX or not 0 <= counter <= _COUNTER_MAX:
        # Never a version that sorts below the real ones (a 14-digit ms, a 7-digit counter).
        raise errors.BadVersion(f"no version at ms {ms}, counter {counter}: out of the fixed widths")
    return f"{ms:0{_MS_WIDTH}d}.{counter:0{_COUNTER_WIDTH}d}.{writer}"


class VersionClock:
    """A thread-safe hybrid logical clock producing :data:`VERSION_ATTR` values."""

    def __init__(self, writer_id: str | None = None, now_ms: Callable[[], int] | None = None):
        self.writer_id = writer_id or os.urandom(4).hex()
        if not _WRITER_RE.fullmatch(self.writer_id):
            raise errors.BadInput(f"writer id must be 1-{MAX_WRITER_CHARS} printable ASCII characters without '.' "
                                  f"or blanks (got {quoted(self.writer_id)}): it ends every version the writer stamps")
        self._now_ms = now_ms or globals()["now_ms"]
        self._lock = threading.Lock()
        self._ms = 0
        self._counter = 0

    def now(self) -> int:
        """The clock's wall time (ms): what a stored version is checked against."""
        return self._now_ms()

    def next(self) -> str:
        """A version greater than every version this clock issued or observed."""
        with self._lock:
            now = self._now_ms()
            if now > self._ms:
                self._ms, self._counter = now, 0
            else:
                self._counter += 1
                if self._counter > _COUNTER_MAX:  # a million writes in one ms: borrow the next ms
                    self._ms, self._counter = self._ms + 1, 0
            return format_version(self._ms, self._counter, self.writer_id)

    def observe(self, version: str | None) -> None:
        """Make the next version greater than ``version`` (seen on a fenced write's loser).

        Checked first (:func:`check_version` against this clock): a malformed version, or one
        further ahead than the skew bound, raises :class:`~reshard.errors.BadVersion` and
        the clock does not move."""
        if not version:
            return
        ms, counter, _ = check_version(version, self._now_ms())
        with self._lock:
            if (ms, counter) >= (self._ms, self._counter):
                self._ms, self._counter = ms, counter


def version_of(item: Mapping[str, Any] | None) -> str:
    """The item's version string; ``""`` (oldest) for none, a pre-migration item, or a
    ``_rs_v`` that is no string at all (written by something else: a reader treats it as
    the oldest, a writer refuses it with :func:`stored_version`). Never raises."""
    if not item:
        return ""
    av = item.get(VERSION_ATTR)
    if av is None:
        return ""
    v = av.get("S") if isinstance(av, Mapping) else None
    return v if isinstance(v, str) else ""


def stored_version(item: Mapping[str, Any] | None, now: int | None, what: str) -> str:
    """The version a writer may adopt from a stored ``item`` (``""``: none stored), checked
    with :func:`check_version`; otherwise :class:`~reshard.errors.BadVersion` naming ``what``
    (the item) and the value, and how to clear it. ``now`` None: the format only (a job that
    copies or compares a version adopts none: it never judges another host's clock). Pure."""
    if not item or VERSION_ATTR not in item:
        return ""
    av = item[VERSION_ATTR]
    v = av.get("S") if isinstance(av, Mapping) and len(av) == 1 else None
    try:
        if not isinstance(v, str):
            raise errors.BadVersion(f"{VERSION_ATTR} is {quoted(json.dumps(av, default=repr))}, not a string")
        if now is None:
            parse_version(v)
        else:
            check_version(v, now)
    except errors.BadVersion as e:
        raise errors.BadVersion(
            f"{what} carries a {VERSION_ATTR} that no reshard writer wrote ({e}); refusing to write it "
            f"rather than adopt that version (it would fence out every later write of the item). A writer "
            f"outside reshard set it: remove it (UpdateItem REMOVE {VERSION_ATTR}) and write the item again; "
            f"`reshard verify` reports items like it") from None
    return v


def newest(items):
    """The item with the highest version among ``items`` (Nones ignored); None if none.

    A tie (two unversioned old copies of one item in a random-suffix layout) goes to the
    smallest item in a canonical order, never to whichever came first: DynamoDB answers
    a BatchGetItem in no particular order, and two shims that picked different copies
    would each write their own copy, both passing their fences (two acknowledged
    ``ADD 1`` returning the same value, one lost). The same pick everywhere lets the
    version fence order them.
    """
    best, best_v = None, None
    for it in items:
        if it is None:
            continue
        v = version_of(it)
        if best is None or v > best_v or (v == best_v and _canonical(it) < _canonical(best)):
            best, best_v = it, v
    return best


def _canonical(item: Mapping[str, Any]) -> str:
    return json.dumps(item, sort_keys=True, default=repr)


@dataclass(frozen=True)
class Fence:
    """A version condition for a write (``fence_for``: only onto an older version;
    ``unchanged``: only onto exactly this version)."""

    expression: str
    names: dict
    values: dict

    def kwargs(self) -> dict:
        """The ConditionExpression / ExpressionAttributeNames / ExpressionAttributeValues of a call."""
        out = {"ConditionExpression": self.expression, "ExpressionAttributeNames": dict(self.names)}
        if self.values:
            out["ExpressionAttributeValues"] = dict(self.values)
        return out


def fence_for(version: str) -> Fence:
    """The fence for writing an item whose version is ``version`` (``""``: unversioned).

    An unversioned item (pre-migration, copied by the backfill) may only replace an
    unversioned item or nothing: any versioned item came from a shim write, which is
    newer than anything written before the migration.
    """
    names = {"#rs_v": VERSION_ATTR}
    if not version:
        return Fence("attribute_not_exists(#rs_v)", names, {})
    return Fence("attribute_not_exists(#rs_v) OR #rs_v < :rs_v", names, {":rs_v": {"S": version}})


def own_attempt(version: str | None, stored: Mapping[str, Any] | None) -> bool:
    """Whether ``stored`` (read after a write of ``version`` failed its condition) is that write's
    own landed attempt: its answer was lost and the retry met it.

    Versions are unique per writer (a writer id, a clock that never repeats), so a stored
    version equal to the attempt's can only have been written by this very attempt.
    """
    return bool(version) and version_of(stored) == version


def unchanged(version: str, key_attr: str) -> Fence:
    """Only if the item still holds exactly ``version`` (``""``: still unversioned, and present).

    For deleting or replacing something we looked at: a write that landed since (a newer
    version) makes the condition fail, and that newer write stays. ``key_attr`` (the
    partition key attribute) tells "still unversioned" from "gone".
    """
    if not version:
        return Fence("attribute_exists(#rs_k) AND attribute_not_exists(#rs_v)",
                     {"#rs_v": VERSION_ATTR, "#rs_k": key_attr}, {})
    return Fence("#rs_v = :rs_v", {"#rs_v": VERSION_ATTR}, {":rs_v": {"S": version}})


def still_tombstone(version: str, key_attr: str) -> Fence:
    """:func:`unchanged`, and still a delete marker: for deleting a tombstone we scanned.

    The version alone is not enough: a write that stamps no version (a steady shim's update,
    after a retire) turns the tombstone back into an item -- it removes ``_rs_del`` -- and
    keeps the ``_rs_v`` it found, so "same version" would delete an acknowledged write
    (a25's finding 4)."""
    fence = unchanged(version, key_attr)
    return Fence(f"attribute_exists(#rs_del) AND ({fence.expression})", {**fence.names, "#rs_del": TOMBSTONE_ATTR},
                 fence.values)


def copy_fence(version: str, key_attr: str, source: str) -> Fence:
    """The fence of the backfill's copy of an old item of ``version`` whose old key is ``source``.

    A versioned item (a shim wrote it) goes onto nothing, an unversioned item, or an
    older version (:func:`fence_for`): the newest version of a logical item wins
    whichever of its old copies the backfill meets first. An *unversioned* item
    (pre-migration) goes onto nothing, or onto our own earlier copy of the same source
    (unversioned and stamped ``_rs_src = source``: a redone page). Anything else there
    -- a versioned item, or another unversioned old copy of the same logical item --
    stays, and :func:`copy_outcome` judges it. ``key_attr`` (the partition key
    attribute) tells "nothing there" from "something unversioned there".
    """
    if version:
        return fence_for(version)
    return Fence("attribute_not_exists(#rs_k) OR (attribute_not_exists(#rs_v) AND #rs_src = :rs_src)",
                 {"#rs_k": key_attr, "#rs_v": VERSION_ATTR, "#rs_src": SOURCE_ATTR}, {":rs_src": {"S": source}})


def copy_outcome(version: str, target: Mapping[str, Any] | None, same_content: bool) -> str:
    """Why a copy of an old item of ``version`` was fenced off ``target`` (what the new key holds now).

    * ``"newer"`` -- the target has our version or a newer one (a shim write, a tombstone, a
      newer old copy of the same logical item): it stays;
    * ``"gone"`` -- the target vanished (or became older) since the fence failed: the
      caller copies again;
    * ``"same"`` -- an unversioned target with the same content (a duplicate
      old copy, harmless): nothing to do;
    * ``"collision"`` -- an unversioned target with different content and another
      source: two pre-migration copies of one logical item disagree; report it.

    ``same_content``: the target's logical content equals the source's.
    """
    if target is None:
        return "gone"
    held = version_of(target)
    if held and held >= version:
        return "newer"
    if version:
        return "gone"  # older than ours by now (it changed since the fence failed): copy again
    return "same" if same_content else "collision"


def tombstone(key: Mapping[str, Any], version: str) -> dict:
    """A delete marker: the physical key, the delete's version, and the flag."""
    item = dict(key)
    item[VERSION_ATTR] = {"S": version}
    item[TOMBSTONE_ATTR] = {"BOOL": True}
    return item


@dataclass(frozen=True)
class CopyAction:
    """What to do after an unconditional copy of ``scanned`` when the source now reads ``current``.

    ``kind``:
      * ``"done"``: the source did not change; the batch write left the right item.
      * ``"recopy"``: the source changed (a shim write or a delete's tombstone): write
        ``current`` re-keyed, fenced by its version. If a newer shim write is
        already in the target, the fence keeps it.
      * ``"undo"``: the source is gone without a tombstone (deleted by a writer that
        bypasses the shim): delete the copy we made, but only if it is still ours
        (same version), so a shim write that arrived meanwhile stays.
    """

    kind: str
    item: Mapping[str, Any] | None = None


def copy_action(scanned: Mapping[str, Any], current: Mapping[str, Any] | None) -> CopyAction:
    if current == scanned:
        return CopyAction("done")
    if current is None:
        return CopyAction("undo", scanned)
    return CopyAction("recopy", current)
