"""Where verify keeps its records between the scan and the join: SQLite files in a run directory.

Layout (``<base>`` is ``--records-dir``, default ``$RESHARD_VERIFY_DIR`` or
``~/.cache/reshard/verify``)::

    <base>/<control table>/<migration id>/run-<run:06d>-<run token>/
        seg-00003.sqlite     one scan segment's records and the pages they came from
        join.sqlite          every segment's records, indexed, and the suspects

Why files on the host, per segment: a page's records are committed to its segment's file
before the page returns, i.e. before the engine checkpoints it, so a kill redoes at most
that page (its records are replaced, keyed by the page's start). Each file also lists the
pages it holds (start key -> next key); the join uses a segment's file only if those pages
chain from the start of the segment to its end. A segment scanned (even partly) by
another host or process elsewhere, or a file lost with its disk, fails that test and the
join scans that segment again, records only, before it joins: correct on any number of
hosts, and as cheap as one scan on one. Processes of one host share the directory
(SQLite's locking; one writer per segment file). The run token (when the run
was started) keeps a re-created control table's run 1 apart from an older run 1.

Memory: rows stream through SQLite (bounded page cache, sorts spilled to temporary
files); nothing holds all records in Python. Disk: about 200 bytes per scanned item,
removed by the host that ran the join when it finished (renamed aside before the verdict
returns, deleted by a background thread: :func:`discard`; a directory another host's join
made useless, or a run killed for good, left goes a week later, when another run of the
migration starts on this host).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import shutil
import sqlite3
import threading
import time
from typing import Callable, Iterable, Iterator

from reshard.control.runs import read_run
from reshard.core.join import COLUMNS, NEW, OLD, Record, from_row
from reshard.core.phases import VERIFY_JOB

# No index: rows are only appended, read whole by the join, and deleted by page on a redo (rare).
SCHEMA = ("CREATE TABLE IF NOT EXISTS rec (key BLOB, ident BLOB, side INT, version TEXT, live INT, "
          "digest BLOB, ttl TEXT, nkey BLOB, cslot BLOB, kslot BLOB, flag INT, fields TEXT, page INT);"
          "CREATE TABLE IF NOT EXISTS pages (start TEXT PRIMARY KEY, id INTEGER, next TEXT, token INTEGER);")
_COLS = ", ".join(COLUMNS)
# The page id is written into the statement (an int): each Record is bound as it is, no tuple per row.
_INSERT = f"INSERT INTO rec ({_COLS}, page) VALUES ({', '.join('?' * len(COLUMNS))}, {{page:d}})"
#: SQLite's page cache per connection (KiB, as a negative cache_size): the join's memory bound.
CACHE_KIB = 16 * 1024
#: A run directory untouched this long is removed when another run of the migration starts here.
STALE_SECONDS = 7 * 24 * 3600
#: How often a long join calls back (its caller renews the lease there).
TICK_SECONDS = 2.0
END = ""  # a page's ``next`` when the segment ended; a segment's first page starts at ""
#: A finished run's record directory is renamed to this prefix, then removed (``discard``).
TRASH_PREFIX = ".trash-"
#: The token of the join's own re-scan of a segment (after ``forget``): above any lease's.
RESCAN_TOKEN = 1 << 62


class StaleWrite(Exception):
    """A page write fenced off: a later lease holder of the segment already wrote this file."""


def default_base() -> pathlib.Path:
    env = os.environ.get("RESHARD_VERIFY_DIR")
    if env:
        return pathlib.Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(cache) / "reshard" / "verify"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:100] or "_"


class RunRecords:
    """A verify page function's record directory on this host and its segment files, made on
    first use (the table's :class:`reshard.jobs.verify.Verifier`, the index's
    ``IndexVerifier``). The run record names the directory, so a re-created control table's
    run of the same number is another; ``records_subdir`` keeps two verifiers of one scan (a
    combined migration) apart. Needs ``store``, ``migration_id``, ``run``, ``opts``,
    ``records_dir`` (None: derived), ``_segment_files`` and ``_files_lock``."""

    records_subdir = ""

    def _records_dir(self) -> pathlib.Path:
        if self.records_dir is None:
            info = read_run(self.store, self.migration_id, VERIFY_JOB, self.run)
            token = repr(info.started_at) if info is not None else "?"
            path = run_dir(self.opts.records_dir, self.store.table, self.migration_id, self.run, token)
            self.records_dir = path / self.records_subdir if self.records_subdir else path
        return self.records_dir

    def _files(self) -> "SegmentFiles":
        with self._files_lock:
            if self._segment_files is None:
                self._segment_files = SegmentFiles(self._records_dir())
            return self._segment_files


def run_dir(base: str | os.PathLike | None, control_table: str, migration_id: str, run: int,
            token: str) -> pathlib.Path:
    """The directory of one verify run's records on this host (older runs' are removed)."""
    parent = pathlib.Path(base) if base else default_base()
    parent = parent / _safe(control_table) / _safe(migration_id)
    name = f"run-{run:06d}-{hashlib.sha256(token.encode()).hexdigest()[:12]}"
    parent.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for old in parent.glob(TRASH_PREFIX + "*"):  # left by a process killed while removing it: garbage
        shutil.rmtree(old, ignore_errors=True)
    for old in parent.glob("run-*"):
        # A run's join removes its directory; one left by a run killed and never resumed here
        # goes once untouched for STALE_SECONDS. (Nothing younger: the same names may serve
        # another endpoint or account. A directory removed too early costs a scan, never a
        # verdict: the join scans again what it lacks.)
        try:
            if old.name != name and now - old.stat().st_mtime > STALE_SECONDS:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass
    path = parent / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def _connect(path: pathlib.Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(str(path), timeout=60, isolation_level=None, check_same_thread=False)
    con.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
    con.execute("PRAGMA temp_store = FILE")
    con.execute("PRAGMA journal_mode = WAL")
    con.execute("PRAGMA synchronous = NORMAL")
    con.executescript(SCHEMA)
    return con


def segment_path(directory: pathlib.Path, segment: int) -> pathlib.Path:
    return directory / f"seg-{segment:05d}.sqlite"


class SegmentFiles:
    """The segment files of one run directory this process writes: one open connection per
    segment (a segment is worked by one worker at a time; opening per page costs more than
    the page's inserts)."""

    def __init__(self, directory: pathlib.Path):
        self.directory = directory
        self._cons: dict[int, sqlite3.Connection] = {}
        self._lock = threading.Lock()

    def _con(self, segment: int) -> sqlite3.Connection:
        with self._lock:
            con = self._cons.get(segment)
            if con is None:
                con = self._cons[segment] = _connect(segment_path(self.directory, segment))
            return con

    def write_page(self, segment: int, start: str, nxt: str, records: Iterable[Record],
                   token: int | None = None) -> None:
        """Keep one scanned page's records (replacing a previous attempt at the same page),
        committed when this returns.

        ``token``: the segment lease's fencing token (it only grows, renewals too). A write
        under a token below one this file already holds is refused with :class:`StaleWrite`:
        a worker of this host paused past its lease (after its deadline check) must not put
        its older observations over the pages a later holder of this host wrote.
        """
        con = self._con(segment)
        con.execute("BEGIN IMMEDIATE")
        try:
            if token is not None:
                top = con.execute("SELECT MAX(token) FROM pages").fetchone()[0]
                if top is not None and top > token:
                    raise StaleWrite(f"segment {segment}: token {token} is below this file's {top}")
            row = con.execute("SELECT id FROM pages WHERE start = ?", (start,)).fetchone()
            if row is not None:
                page = row[0]
                # A redone page: what its first attempt saw (items since deleted, too) goes.
                con.execute("DELETE FROM rec WHERE page = ?", (page,))
            else:
                page = con.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM pages").fetchone()[0]
            con.executemany(_INSERT.format(page=int(page)), records)
            con.execute("INSERT OR REPLACE INTO pages (start, id, next, token) VALUES (?, ?, ?, ?)",
                        (start, page, nxt, token))
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")

    def forget(self, segment: int) -> None:
        """Drop a segment's records (before scanning it again from its start)."""
        with self._lock:
            con = self._cons.pop(segment, None)
        if con is not None:
            con.close()
        forget(self.directory, segment)

    def close(self, discard: bool = False) -> None:
        """Close every segment file; ``discard``: their records are no longer needed (the join
        finished), so closing syncs nothing to disk."""
        with self._lock:
            cons, self._cons = list(self._cons.values()), {}
        for con in cons:
            if discard:
                con.execute("PRAGMA synchronous = OFF")
            con.close()


def discard(files: SegmentFiles | None, directory: pathlib.Path | None) -> None:
    """After the join's verdict: close the run's segment files and remove its record directory
    (``directory`` None: kept), off the verdict's path.

    The directory is renamed aside at once (so it is gone from the run's path, and SQLite,
    finding its files moved, skips the checkpoint it would copy each WAL with on close), and
    removed by a background thread: deleting a few hundred MB can take seconds on some disks
    and tells the verdict nothing. Not a daemon thread: a process finishes it before it exits;
    one killed first leaves a ``.trash-`` directory the next run here removes (``run_dir``).
    """
    if directory is None:
        if files is not None:
            files.close(discard=True)
        return
    trash = directory.with_name(f"{TRASH_PREFIX}{directory.name}-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        os.rename(directory, trash)
    except OSError:  # gone already, or not renameable here: removed where it is
        trash = directory
    if files is not None:
        files.close(discard=True)
    threading.Thread(target=shutil.rmtree, args=(trash,), kwargs={"ignore_errors": True},
                     name="verify-records-removal").start()


def write_page(directory: pathlib.Path, segment: int, start: str, nxt: str, records: Iterable[Record],
               token: int | None = None) -> None:
    """:meth:`SegmentFiles.write_page` on a connection of its own."""
    files = SegmentFiles(directory)
    try:
        files.write_page(segment, start, nxt, records, token)
    finally:
        files.close()


def _chain(pages: Iterable[tuple[str, int, str]]) -> list[int] | None:
    """The ids of the pages that chain from a segment's start to its end (``(start, id, next)``
    rows), or None when they do not."""
    chain = {start: (page, nxt) for start, page, nxt in pages}
    at, out = END, []
    while len(out) <= len(chain):
        if at not in chain:
            return None
        page, at = chain[at]
        out.append(page)
        if at == END:
            return out
    return None


def complete(directory: pathlib.Path, segment: int) -> bool:
    """Whether this host holds the records of every page of ``segment``, start to end."""
    path = segment_path(directory, segment)
    if not path.exists():
        return False
    con = _connect(path)
    try:
        return _chain(con.execute("SELECT start, id, next FROM pages")) is not None
    finally:
        con.close()


def forget(directory: pathlib.Path, segment: int) -> None:
    """Drop a segment's records (before scanning it again from its start)."""
    for suffix in ("", "-wal", "-shm"):
        pathlib.Path(str(segment_path(directory, segment)) + suffix).unlink(missing_ok=True)


class Join:
    """Every segment's records in one indexed file, and the logical items to re-read."""

    def __init__(self, directory: pathlib.Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "join.sqlite"
        self.directory = directory
        self.con = self._open(self.path)

    @staticmethod
    def _open(path: pathlib.Path) -> sqlite3.Connection:
        con = sqlite3.connect(str(path), timeout=60, isolation_level=None, check_same_thread=False)
        con.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        con.execute("PRAGMA temp_store = FILE")
        # Built in a file of its own and renamed into place whole (``build``): no journal, no sync.
        con.execute("PRAGMA journal_mode = OFF")
        con.execute("PRAGMA synchronous = OFF")
        con.executescript(
            "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT);"
            "CREATE TABLE IF NOT EXISTS sus (ident BLOB PRIMARY KEY, fields TEXT, why TEXT) WITHOUT ROWID;")
        return con

    def close(self) -> None:
        self.con.close()

    def built(self) -> bool:
        return self.con.execute("SELECT 1 FROM meta WHERE name = 'built'").fetchone() is not None

    def build(self, segments: int, verdict, *, tick: Callable[[], None] = lambda: None) -> dict[str, int]:
        """Merge the segment files, find the suspects; returns counts (``old_copies``, ``suspects``).

        ``verdict(records) -> (kind, live old copies)``: the rule for one identity's records.
        ``tick()`` is called every few seconds of work, also from inside long SQL statements
        (the caller renews its lease there; what it raises stops the build).
        """
        # Built in a file only this build writes, renamed over ``join.sqlite`` once whole: a
        # build killed part-way (no journal: its file may hold anything) or a stale builder
        # of this host (a process whose lease was taken over by another of the same host,
        # woken from a pause) never touches the join file a live holder reads its suspects from.
        shared = self.con
        private = self.directory / f"join.{os.getpid()}.{threading.get_ident()}.{os.urandom(4).hex()}.sqlite"
        con = self.con = self._open(private)
        failure: list[BaseException] = []
        last = [time.monotonic()]

        def progress() -> int:
            if time.monotonic() - last[0] < TICK_SECONDS:
                return 0
            last[0] = time.monotonic()
            try:
                tick()
            except BaseException as e:  # noqa: BLE001 - re-raised below, once SQLite stopped
                failure.append(e)
                return 1  # interrupts the statement
            return 0

        con.set_progress_handler(progress, 100_000)
        done = False
        try:
            self._merge(segments)
            con.execute("BEGIN")  # one transaction for the rest: nothing to sync statement by statement
            try:
                out = self._build(verdict)
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")
            done = True
            return out
        except sqlite3.OperationalError:
            if failure:
                raise failure[0] from None
            raise
        finally:
            con.set_progress_handler(None, 0)
            con.close()
            if done:
                shared.close()
                os.replace(private, self.path)
                self.con = self._open(self.path)
            else:
                self.con = shared
                for suffix in ("", "-journal", "-wal", "-shm"):
                    pathlib.Path(str(private) + suffix).unlink(missing_ok=True)

    def _merge(self, segments: int) -> None:
        """Every segment file's records into ``rec`` (outside a transaction: DETACH needs that)."""
        con = self.con
        for statement in ("DROP TABLE IF EXISTS rec", "DELETE FROM sus", "DROP TABLE IF EXISTS sus_more"):
            con.execute(statement)
        # Appended in file order (a key is in one segment, once): no index to keep up.
        con.execute("CREATE TABLE rec (key BLOB, ident BLOB, side INT, version TEXT, live INT, "
                    "digest BLOB, ttl TEXT, nkey BLOB, cslot BLOB, kslot BLOB, flag INT, fields TEXT)")
        for s in range(segments):
            con.execute("ATTACH DATABASE ? AS seg", (str(segment_path(self.directory, s)),))
            try:
                # Only the pages on the segment's chain: a page off it (a stale writer's, written
                # late) is no observation of the segment as it was scanned.
                chain = _chain(con.execute("SELECT start, id, next FROM seg.pages"))
                if chain is None:
                    raise RuntimeError(f"segment {s}'s records do not chain from its start to its end")
                con.execute("CREATE TEMP TABLE IF NOT EXISTS chain (id INTEGER PRIMARY KEY)")
                con.execute("DELETE FROM temp.chain")
                con.executemany("INSERT INTO temp.chain VALUES (?)", [(i,) for i in chain])
                con.execute(f"INSERT INTO rec ({_COLS}) SELECT {_COLS} FROM seg.rec WHERE page IN "
                            "(SELECT id FROM temp.chain)")
            finally:
                con.execute("DETACH DATABASE seg")

    def _build(self, verdict) -> dict[str, int]:
        """Three sorted passes (SQLite's external sort: sequential I/O, bounded memory; the
        hashes have no locality an index lookup could use)."""
        con = self.con
        for statement in ("DROP TABLE IF EXISTS oc",
                          "CREATE TABLE oc (ident BLOB PRIMARY KEY) WITHOUT ROWID"):
            con.execute(statement)
        found: list[tuple] = []

        def suspect(ident: bytes, fields: str, why: str) -> None:
            found.append((ident, fields, why))
            if len(found) >= 1000:
                self._add(found)

        # Grouped and sorted by SQLite (external sorts: sequential I/O, bounded memory; the
        # hashes have no locality an index lookup could use); Python sees the few groups that
        # are not plainly fine. x'' stands for an unmappable item (identities are 16 bytes).
        for statement in ("DROP TABLE IF EXISTS bad", "DROP TABLE IF EXISTS hard",
                          "CREATE TABLE bad (k BLOB PRIMARY KEY, lo BLOB, hi BLOB) WITHOUT ROWID",
                          "CREATE TABLE hard (ident BLOB PRIMARY KEY) WITHOUT ROWID"):
            con.execute(statement)
        # 1. Another item (or an unmappable one) at an identity's new key: the key's occupant
        #    is not the identity whose old copy claims it.
        # (MIN < MAX: two different values in the group, without COUNT(DISTINCT)'s table per group.)
        con.execute("INSERT INTO bad SELECT k, MAX(CASE WHEN claim = 0 THEN who END), "
                    " MAX(CASE WHEN claim = 0 THEN who END) FROM ("
                    " SELECT key AS k, COALESCE(ident, x'') AS who, 0 AS claim FROM rec"
                    " UNION ALL SELECT nkey, ident, 1 FROM rec WHERE side = 0 AND ident IS NOT NULL)"
                    " GROUP BY k HAVING SUM(claim = 0) = 1 AND MIN(who) < MAX(who)")
        con.execute("INSERT OR IGNORE INTO sus SELECT c.ident, c.fields, 'new key' FROM rec c JOIN bad b "
                    "ON b.k = c.nkey WHERE c.side = 0 AND c.ident IS NOT NULL AND c.ident != b.hi")
        con.execute("DELETE FROM bad")
        # 2. Another item at one of an identity's old candidate keys: an occupant of its slot
        #    (an item whose key is in it) that is not the identity itself.
        con.execute("INSERT INTO bad SELECT k, MIN(CASE WHEN claim = 0 THEN who END), "
                    " MAX(CASE WHEN claim = 0 THEN who END) FROM ("
                    " SELECT kslot AS k, COALESCE(ident, x'') AS who, 0 AS claim FROM rec WHERE kslot IS NOT NULL"
                    " UNION ALL SELECT cslot, ident, 1 FROM rec WHERE side != 2 AND ident IS NOT NULL)"
                    " GROUP BY k HAVING SUM(claim = 0) > 0 AND SUM(claim = 1) > 0 AND MIN(who) < MAX(who)")
        con.execute("INSERT OR IGNORE INTO sus SELECT c.ident, c.fields, 'old key' FROM rec c JOIN bad b "
                    "ON b.k = c.cslot WHERE c.side != 2 AND c.ident IS NOT NULL AND (b.lo != b.hi OR c.ident != b.hi)")
        con.execute("DROP TABLE bad")
        # 3. Each identity's own records, by the rule (``verdict``). The two shapes nearly every
        #    item has are cleared in SQL: an old copy and its new copy at its new key, both live
        #    with equal content (equal TTL too: they expire together) or both tombstones; an
        #    item that does not move. ``verdict`` says None of both (``_plainly_equal``).
        con.execute("INSERT INTO hard SELECT ident FROM rec WHERE ident IS NOT NULL GROUP BY ident HAVING NOT ("
                    " (COUNT(*) = 2 AND SUM(side = 0) = 1 AND SUM(side = 1 AND key = nkey) = 1 AND MAX(flag) = 0"
                    "  AND ((SUM(live) = 2 AND MIN(digest) = MAX(digest)) OR SUM(live) = 0))"
                    " OR (COUNT(*) = 1 AND SUM(side = 0 AND key = nkey) = 1 AND MAX(flag) = 0))")
        rows = con.execute(f"SELECT {', '.join('r.' + c for c in COLUMNS)} FROM rec r JOIN hard h "
                           "ON h.ident = r.ident ORDER BY r.ident")
        for group in _groups(rows):
            records = [from_row(r) for r in group]
            kind, live_olds = verdict(records)
            if kind is not None:
                suspect(records[0].ident, records[0].fields, kind)
            elif live_olds > 1:
                con.execute("INSERT OR IGNORE INTO oc VALUES (?)", (records[0].ident,))
        con.execute("DROP TABLE hard")
        self._add(found)
        # Counted here only if not re-read (the judge counts those it clears).
        old_copies = con.execute("SELECT COUNT(*) FROM oc LEFT JOIN sus s ON s.ident = oc.ident "
                                 "WHERE s.ident IS NULL").fetchone()[0]
        con.execute("DROP TABLE oc")
        suspects = con.execute("SELECT COUNT(*) FROM sus").fetchone()[0]
        con.execute("INSERT OR REPLACE INTO meta VALUES ('built', '1')")
        return {"old_copies": old_copies, "suspects": suspects}

    def _add(self, found: list[tuple]) -> None:
        # The first reason found is kept: a collision's ("new key", "old key") before the rule's.
        self.con.executemany("INSERT OR IGNORE INTO sus VALUES (?, ?, ?)", found)
        found.clear()

    def suspects(self, after: bytes, limit: int) -> list[tuple[bytes, str, str]]:
        """The next ``limit`` suspects after ``after`` (identity-hash order): (ident, fields, why)."""
        return self.con.execute("SELECT ident, fields, why FROM sus WHERE ident > ? ORDER BY ident LIMIT ?",
                                (after, limit)).fetchall()

    def records(self) -> int:
        return self.con.execute("SELECT COUNT(*) FROM rec").fetchone()[0]


_NOBODY = object()
_SIDE, _LIVE, _DIGEST, _KEY, _NKEY, _FLAG = (COLUMNS.index(c) for c in ("side", "live", "digest", "key", "nkey", "flag"))


def _plainly_equal(group: list[tuple]) -> bool:
    """An identity's rows (``COLUMNS``) in one of the two shapes ``verdict`` clears at sight."""
    if len(group) == 1:
        r = group[0]
        return r[_SIDE] == OLD and r[_KEY] == r[_NKEY] and not r[_FLAG]
    if len(group) != 2:
        return False
    a, b = group
    if a[_SIDE] != OLD:
        a, b = b, a
    return (a[_SIDE] == OLD and b[_SIDE] == NEW and b[_KEY] == b[_NKEY] and not a[_FLAG] and not b[_FLAG]
            and a[_LIVE] == b[_LIVE] and (not a[_LIVE] or a[_DIGEST] == b[_DIGEST]))


def _groups(rows: Iterable[tuple]) -> Iterator[list[tuple]]:
    """Consecutive rows with the same identity (column 1)."""
    group: list[tuple] = []
    for row in rows:
        if group and row[1] != group[0][1]:
            yield group
            group = []
        group.append(row)
    if group:
        yield group
