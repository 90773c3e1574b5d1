"""Where the CPU of a data-path request goes, on both sides (issue 16: "the profile that shows why").

Three throughput goals of issue 16 are not met on a 2-core machine (copy items/s ≥ 10× the
naive loop, ``--processes 2`` ≥ 1.7× ``--processes 1``, cleanup's TTL marking ≥ 5× the old
way), and dynalite -- one single-threaded node process on the same cores -- spends more CPU per
conditional write than the client. This profiles, per data-path operation those goals depend on:

  * ``copy``   -- the backfill's version-conditioned PutItem copy (a real ``backfill`` job);
  * ``ttl``    -- cleanup's conditional TTL-marking UpdateItem (a real ``cleanup`` pass);
  * ``delete`` -- ``cleanup --delete``'s conditional DeleteItem (a real pass);
  * ``scan``   -- verify's Scan pages, as a contrast (a real ``verify`` job; per scanned item);

the server: dynalite under node's sampling CPU profiler (``node --cpu-prof``, through
:class:`reshard.aws.local.DynaliteServer`'s ``cpu_profile_dir``). One server serves the whole
run; each job's samples are cut out of its ``.cpuprofile`` by time (V8's profile clock is the
same CLOCK_MONOTONIC as Python's ``time.monotonic``), so table set-up and JIT warm-up stay out
of the figures. Per operation: dynalite's CPU per request from /proc (all its threads: the main
JavaScript thread, and libuv's pool where classic-level's LevelDB reads and writes run), the
profile's split of the main thread by component (the script's package or dynalite module:
request validation, the pegjs expression parsers under ``dynalite/db``, storage, http, ...;
idle excluded) and its top self-time functions;

the client: ``time.process_time`` per request in the same run, and the same job again in a
child process under cProfile with a per-thread CPU clock (``time.thread_time``; every thread
the job starts is profiled) for its split by component and its top cumulative functions.
cProfile slows the client, so only its shares are used: the µs shown are those shares of the
client's ``process_time`` per item in the unprofiled run.

Then the requests themselves sent by hand in a few shapes (the copy's PutItem, the TTL
UpdateItem and the DeleteItem as reshard sends them; the same condition with shorter
placeholders; no ReturnConsumedCapacity; a smaller item; and, as floors only, weaker or no
conditions), each in its own profile window, rounds alternated: does a client-side choice
that keeps every fence make dynalite's work per request smaller? (``--no-variants`` skips it.)

On a loaded machine a sample also ticks while dynalite waits for a core, so the profile is
read as shares of its main thread, and the µs shown are those shares of the main thread's
CPU from /proc, taken from the same jobs on an unprofiled server (``--no-reference``: the
profiled one; sampling costs dynalite about a third more CPU at the default 200 µs).

Prints tables and writes JSON to benchmarks/results/profile.json.

    PYTHONPATH=. python3 benchmarks/profile.py              # about two and a half minutes
    PYTHONPATH=. python3 benchmarks/profile.py --items 4000 --interval-us 100
"""

from __future__ import annotations

import pathlib
import sys

# Run as a script, this file's directory comes first on sys.path, and this file's name would
# shadow the standard library's ``profile`` that cProfile imports.
_HERE = pathlib.Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != _HERE]

import argparse  # noqa: E402
import cProfile  # noqa: E402
import collections  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pstats  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from benchmarks.backfill import client, prepare  # noqa: E402
from benchmarks.cleanup import to_cleanup  # noqa: E402
from reshard.aws.local import DynaliteServer  # noqa: E402
from reshard.control.store import ControlStore  # noqa: E402
from reshard.jobs.backfill import BACKFILL  # noqa: E402
from reshard.jobs.cleanup import CLEANUP  # noqa: E402
from reshard.jobs.runner import JobOptions, run_job  # noqa: E402
from reshard.jobs.verify import VERIFY  # noqa: E402

#: operation -> (what it is, the DynamoDB request it sends per item, the counter that counts them)
OPS = {
    "copy": ("backfill: version-conditioned PutItem copy", "PutItem", "moved"),
    "ttl": ("cleanup: conditional TTL-marking UpdateItem", "UpdateItem", "expiring"),
    "delete": ("cleanup --delete: conditional DeleteItem", "DeleteItem", "deleted"),
    "scan": ("verify: Scan pages (per scanned item)", "Scan", "checked"),
}


# --------------------------------------------------------------------------- the jobs

def set_up(dynamo, op: str, name: str, n: int, segments: int) -> None:
    """A table of n items where ``op``'s job has its work to do (set-up requests are outside every window)."""
    if op == "copy":
        prepare(dynamo, name, n)
    elif op in ("ttl", "delete"):
        to_cleanup(dynamo, name, n, segments)
    else:
        m, _, store = prepare(dynamo, name, n)
        assert run_job(BACKFILL, dynamo, store, m.id, JobOptions(segments=segments, workers=segments)).done


#: The cleanup pass without its TTL-setting check (dynalite has no TTL; every write is the real one).
CLEANUP_ON_DYNALITE = dataclasses.replace(CLEANUP, prepare=lambda ctx: None)


def run_op(dynamo, op: str, name: str, segments: int, concurrency: int) -> int:
    """``op``'s real job on the table ``set_up`` made; returns how many items it wrote (scanned, for verify)."""
    counter = RequestCounter(dynamo)
    store = ControlStore(dynamo, f"{name}-ctl")
    opts = JobOptions(segments=segments, workers=segments, concurrency=concurrency, delete=op == "delete")
    job = {"copy": BACKFILL, "ttl": CLEANUP_ON_DYNALITE, "delete": CLEANUP_ON_DYNALITE, "scan": VERIFY}[op]
    result = run_job(job, dynamo, store, name, opts)
    assert result.done and (op != "scan" or result.passed), result.as_dict()
    count = int(result.totals[OPS[op][2]])
    assert count > 0, result.totals
    # verify: per item its Scans returned (both layouts' copies), as the scan's CPU goes per item read
    return counter.counts["items scanned"] if op == "scan" else count


class RequestCounter:
    """Requests a client sent, by DynamoDB operation (botocore's ``before-send``, which the lean path emits too)."""

    def __init__(self, dynamo):
        self.counts: collections.Counter = collections.Counter()
        self._lock = threading.Lock()
        dynamo.client.meta.events.register("before-send.dynamodb", self)
        dynamo.client.meta.events.register("after-call.dynamodb.Scan", self._scanned)

    def __call__(self, event_name: str, **kw) -> None:
        with self._lock:
            self.counts[event_name.rsplit(".", 1)[-1]] += 1

    def _scanned(self, parsed=None, **kw) -> None:
        with self._lock:
            self.counts["items scanned"] += len((parsed or {}).get("Items", ()))

    def since(self, before: dict) -> dict:
        with self._lock:
            return {k: v - before.get(k, 0) for k, v in self.counts.items() if v - before.get(k, 0)}


# --------------------------------------------------------------------------- dynalite's CPU from /proc

def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of ``pid`` (Linux /proc; {} elsewhere)."""
    out, tick = {}, os.sysconf("SC_CLK_TCK")
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            fields = pathlib.Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return out


@dataclasses.dataclass
class Window:
    """One measured job: its time span (CLOCK_MONOTONIC), requests, and both sides' CPU."""

    op: str
    label: str
    start: float
    end: float
    items: int
    requests: dict
    client_cpu: float
    server_main_cpu: float
    server_other_cpu: float

    @classmethod
    def measure(cls, op: str, label: str, server, counter: RequestCounter | None, fn) -> "Window":
        pid = server.proc.pid
        before_req = dict(counter.counts) if counter else {}
        s0, c0, t0 = thread_cpu(pid), time.process_time(), time.monotonic()
        items, requests = fn()
        t1, c1, s1 = time.monotonic(), time.process_time(), thread_cpu(pid)
        main = s1.get(pid, 0.0) - s0.get(pid, 0.0)
        other = sum(v - s0.get(t, 0.0) for t, v in s1.items() if t != pid)
        if counter is not None:
            requests = counter.since(before_req)
        return cls(op, label, t0, t1, items, requests, c1 - c0, main, other)


# --------------------------------------------------------------------------- the server's profile

CONDITION_PARSER = "dynalite ConditionExpression parser (pegjs, db/conditionParser.js)"
PARSERS = (CONDITION_PARSER, "dynalite UpdateExpression parser (pegjs, db/updateParser.js)")


def component(url: str, fn: str) -> str:
    """The component of a profile frame, from its script's url (node's: an absolute path for
    dynalite and its packages, ``node:...`` for node's own modules) and function name."""
    if not url:
        if fn == "(garbage collector)":
            return "V8 garbage collector"
        if fn == "(program)":
            return "V8/node native, outside JS (event loop, C++ bindings)"
        return f"V8 {fn or '(anonymous native)'}"
    if "/node_modules/" in url:
        pkg_path = url.rsplit("/node_modules/", 1)[1]
        pkg, _, rest = pkg_path.partition("/")
        if pkg == "dynalite":
            if rest.startswith("validations/"):
                return "dynalite request validation (validations/)"
            if rest == "db/conditionParser.js":
                return CONDITION_PARSER
            if rest == "db/updateParser.js":
                return PARSERS[1]
            if rest == "db/projectionParser.js":
                return "dynalite ProjectionExpression parser (pegjs, db/projectionParser.js)"
            if rest == "db/index.js":
                return "dynalite db/index.js (items, keys, conditions, locks, capacity)"
            if rest.startswith("actions/"):
                return "dynalite actions/ (the operation itself)"
            if rest == "index.js":
                return "dynalite index.js (http handler, JSON body, auth header, CRC32)"
            return f"dynalite {rest}"
        storage = {"level", "classic-level", "abstract-level", "level-transcoder", "level-supports",
                   "memory-level", "functional-red-black-tree", "module-error", "maybe-combine-errors",
                   "node-gyp-build", "napi-macros", "buffer", "ieee754", "base64-js", "is-buffer"}
        if pkg in storage:
            return "storage: level / classic-level (LevelDB binding, JS side)"
        if pkg in ("lock", "async", "once", "wrappy", "lazy"):
            return "control flow: lock / async / once"
        if pkg == "big.js":
            return "numbers: big.js"
        if pkg == "buffer-crc32":
            return "CRC32 of answers: buffer-crc32"
        return f"package {pkg}"
    if url.startswith("node:"):
        mod = url[5:]
        if any(k in mod for k in ("http", "net", "stream", "llhttp", "dns", "tcp")):
            return "node http / net / streams"
        if "crypto" in mod:
            return "node crypto (request ids, md5 key prefixes)"
        if "buffer" in mod or "string_decoder" in mod or "util" in mod:
            return "node buffers / strings / util"
        if "timers" in mod or "process/task_queues" in mod or "events" in mod or "async_hooks" in mod:
            return "node events / timers / microtasks"
        return "node other internals"
    return "other scripts"


VALIDATION = "dynalite request validation (validations/)"
STORAGE = "storage: level / classic-level (LevelDB binding, JS side)"


def load_profile(directory: pathlib.Path) -> dict:
    files = sorted(directory.glob("*.cpuprofile"))
    if not files:
        raise SystemExit(f"no .cpuprofile in {directory}: did dynalite exit normally? see its log")
    return json.loads(files[-1].read_text())


def samples_in(profile: dict, start: float, end: float) -> collections.Counter:
    """Microseconds of main-thread time per profile node id between ``start`` and ``end`` (monotonic s).

    A sample stands for the time until the next one (as Chrome's profiler panel counts it)."""
    times = []
    t = profile["startTime"]
    for delta in profile["timeDeltas"]:
        t += delta
        times.append(t)
    lo, hi = start * 1e6, end * 1e6
    spent: collections.Counter = collections.Counter()
    samples = profile["samples"]
    for i, node in enumerate(samples):
        if lo <= times[i] < hi:
            nxt = times[i + 1] if i + 1 < len(times) else profile["endTime"]
            spent[node] += max(0, min(nxt, hi) - times[i])
    return spent


_SPECIAL = ("(idle)", "(garbage collector)", "(program)", "(root)")


def server_split(profile: dict, spent: collections.Counter, top: int) -> dict:
    """Main-thread time of one window by component and by function (self time), idle excluded.

    A sample in a native frame without a script (a RegExp of the pegjs grammars, ``writev``
    of a socket write, a Buffer method) is charged to its nearest caller that has one."""
    frames = {n["id"]: n["callFrame"] for n in profile["nodes"]}
    parent = {c: n["id"] for n in profile["nodes"] for c in n.get("children", ())}

    def owner(node: int) -> dict:
        frame = frames[node]
        while not frame.get("url") and frame.get("functionName") not in _SPECIAL and node in parent:
            node = parent[node]
            frame = frames[node]
        return frame

    by_component: collections.Counter = collections.Counter()
    by_function: collections.Counter = collections.Counter()
    idle = 0
    for node, us in spent.items():
        frame = frames[node]
        fn = frame.get("functionName", "")
        if fn == "(idle)":
            idle += us
            continue
        home = owner(node)
        by_component[component(home.get("url", ""), home.get("functionName", ""))] += us
        url = frame.get("url", "")
        where = url.rsplit("/node_modules/", 1)[-1] if url else ""
        name = f"{fn or '(anonymous)'} {where}:{frame.get('lineNumber', -1) + 1}" if url else fn
        if not url and home is not frame:
            name += f" (in {home.get('functionName') or '(anonymous)'} {home['url'].rsplit('/node_modules/', 1)[-1]})"
        by_function[name] += us
    busy = sum(by_component.values())
    return {"busy_us": busy, "idle_us": idle,
            "components": [(k, v) for k, v in by_component.most_common()],
            "functions": [(k, v) for k, v in by_function.most_common(top)]}


# --------------------------------------------------------------------------- the client's profile

def client_component(filename: str, fn: str) -> str | None:
    """A cProfile entry's component (``filename``, ``fn`` as pstats keys them); None for a
    built-in that is charged to its callers (``str.join`` is the caller's work)."""
    if filename == "~":  # a built-in
        if "hmac" in fn or "_hashlib" in fn or "openssl" in fn or "sha256" in fn:
            return "SigV4 signing (hmac / hashlib)"
        if "_socket" in fn or "select" in fn or "poll" in fn:
            return "socket I/O (send, recv, poll)"
        if "orjson" in fn or "_json" in fn:
            return "JSON (orjson / json)"
        if "sqlite3" in fn:
            return "verify records (sqlite3, files)"
        if "_thread" in fn or "lock" in fn:
            return "threads, locks, futures"
        if "time.sleep" in fn:
            return "benchmark hooks (emulated round trip, counters)"
        return None
    path = filename.replace("\\", "/")
    if "/reshard/aws/lean.py" in path:
        if fn in ("sign", "signing_key", "_signing_key"):
            return "SigV4 signing (hmac / hashlib)"
        if fn in ("_read_response", "_roundtrip", "_connection", "_dropped", "_drop"):
            return "reshard lean path: HTTP/1.1 exchange"
        return "reshard lean path: request build, events, answer decode"
    if "/reshard/aws/" in path:
        return "reshard Dynamo.call (retries, guard, capacity, errors)"
    if "/tenacity/" in path:
        return "tenacity (Dynamo.call's retry loop)"
    if "/reshard/jobs/" in path:
        return "reshard jobs (engine, runner, budget, the job's rules)"
    if "/reshard/core/" in path:
        return "reshard core (key mapping, versions, digests)"
    if "/reshard/control/" in path:
        return "reshard control table (leases, runs, fleet)"
    if "/reshard/" in path:
        return "reshard other"
    if "/benchmarks/" in path:
        return "benchmark hooks (emulated round trip, counters)"
    if "/botocore/" in path or "/boto3/" in path:
        return "botocore (events, hooks, control-table calls)"
    if "/urllib3/" in path or "/http/client.py" in path or "/email/" in path:
        return "urllib3 / http.client / email (botocore's calls)"
    if "/json/" in path:
        return "JSON (orjson / json)"
    if path.endswith(("/hmac.py", "/hashlib.py")):
        return "SigV4 signing (hmac / hashlib)"
    if path.endswith(("/socket.py", "/selectors.py", "/ssl.py")):
        return "socket I/O (send, recv, poll)"
    if path.endswith(("/threading.py", "/queue.py", "/contextlib.py")) or "/concurrent/" in path:
        return "threads, locks, futures"
    if "/sqlite3/" in path or path.endswith(("/tempfile.py", "/shutil.py")):
        return "verify records (sqlite3, files)"
    if "/logging/" in path:
        return "logging"
    return "other Python"


#: Frames that only hand work on (a thread's run, the pool's loop): their cumulative time is everything.
_WRAPPERS = ("threading.py", "concurrent/futures", "benchmarks/profile.py")


def client_split(stats: pstats.Stats, top: int) -> dict:
    """The client's CPU by component (self time; a generic built-in's charged to its callers in
    proportion), its top self-time and top cumulative functions (thread hand-offs left out)."""
    by_component: collections.Counter = collections.Counter()
    self_fn: collections.Counter = collections.Counter()
    cumulative: collections.Counter = collections.Counter()
    for (filename, line, fn), (_cc, _nc, tt, ct, callers) in stats.stats.items():
        name = f"{fn} {short(filename)}:{line}" if filename != "~" else fn
        comp = client_component(filename, fn)
        if comp is None:
            from_callers = sum(c[2] for c in callers.values()) or 1.0
            for (cfile, _cline, cfn), c in callers.items():
                by_component[client_component(cfile, cfn) or "other built-ins"] += tt * c[2] / from_callers
        else:
            by_component[comp] += tt
        self_fn[name] += tt
        if not any(w in filename for w in _WRAPPERS) and fn not in ("<module>", "run", "_bootstrap_inner"):
            cumulative[name] += ct
    return {"total_s": sum(by_component.values()),
            "components": [(k, v) for k, v in by_component.most_common()],
            "self": [(k, v) for k, v in self_fn.most_common(top)],
            "cumulative": [(k, v) for k, v in cumulative.most_common(top)]}


def short(filename: str) -> str:
    for marker in ("/site-packages/", "/reshard/", "/lib/python3"):
        if marker in filename:
            tail = filename.split(marker, 1)[1]
            return ("reshard/" + tail) if marker == "/reshard/" else tail.split("/", 1)[-1] if marker == "/lib/python3" \
                else tail
    return filename


def cprofile_child(op: str, endpoint: str, name: str, segments: int, concurrency: int, latency_ms: float,
                   out: str) -> None:
    """In a fresh process (so that every thread the job uses starts profiled): ``op``'s job under cProfile."""
    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()
    real_run = threading.Thread.run

    def profiled_run(self):
        prof = cProfile.Profile(time.thread_time)  # CPU, not wall: waits for the round trip are not work
        with lock:
            profiles.append(prof)
        prof.enable()
        try:
            real_run(self)
        finally:
            prof.disable()

    threading.Thread.run = profiled_run
    dynamo = client(endpoint, latency_ms)
    main = cProfile.Profile(time.thread_time)
    c0 = time.process_time()
    main.enable()
    items = run_op(dynamo, op, name, segments, concurrency)
    main.disable()
    cpu = time.process_time() - c0
    from reshard.jobs import runner
    if runner._pool is not None:  # its threads end, so their profiles are complete
        runner._pool.shutdown(wait=True)
    stats = pstats.Stats(main)
    with lock:
        for prof in profiles:
            try:
                stats.add(prof)
            except TypeError:  # a thread that never ran a profiled call
                continue
    stats.dump_stats(out)
    print(json.dumps({"items": items, "cpu_s": cpu}))


# --------------------------------------------------------------------------- hand-sent variants of the copy

#: A version as the shims stamp them (the fence compares it as a string; its form does not matter here).
_VERSION = "0001763884800000.00000.0000000000000001"


def shapes(key_attrs: list[str], ttl_attr: str) -> list[tuple[str, str, bool, object]]:
    """Request shapes to compare: (label, operation, preload the items?, item -> kwargs without TableName).

    The first of each group is what reshard sends; "same fence" rows keep its condition's
    meaning exactly; rows marked NOT are weaker and only show what the condition costs."""
    from reshard.core.layout import SOURCE_ATTR
    from reshard.core.versions import copy_fence, unchanged
    pk = key_attrs[0]

    def src(item):
        return "src#" + item[pk]["S"]

    def put(item, small=False, rcc=True, **cond):
        body = {k: item[k] for k in key_attrs} if small else dict(item)
        body[SOURCE_ATTR] = {"S": src(item)}
        return {"Item": body, **({"ReturnConsumedCapacity": "TOTAL"} if rcc else {}), **cond}

    def key(item):
        return {k: item[k] for k in key_attrs}

    def ttl(item, fence, tail, names, values, update="SET #ttl = :exp"):
        return {"Key": key(item), "UpdateExpression": update,
                "ConditionExpression": f"({fence.expression}){tail}",
                "ExpressionAttributeNames": {**fence.names, **names},
                "ExpressionAttributeValues": {**fence.values, **values}}

    exp = {"N": "1764000000"}
    return [
        ("copy: the fence + ReturnConsumedCapacity (as sent)", "put_item", False,
         lambda it: put(it, **copy_fence("", pk, src(it)).kwargs())),
        ("copy: same fence, 1-letter placeholders", "put_item", False,
         lambda it: put(it, ConditionExpression="attribute_not_exists(#k) OR (attribute_not_exists(#v) AND #s = :s)",
                        ExpressionAttributeNames={"#k": pk, "#v": "_rs_v", "#s": SOURCE_ATTR},
                        ExpressionAttributeValues={":s": {"S": src(it)}})),
        ("copy: same fence, no ReturnConsumedCapacity", "put_item", False,
         lambda it: put(it, rcc=False, **copy_fence("", pk, src(it)).kwargs())),
        ("copy: same fence, item of keys + _rs_src only", "put_item", False,
         lambda it: put(it, small=True, **copy_fence("", pk, src(it)).kwargs())),
        ("copy: attribute_not_exists(#k) only (NOT the fence)", "put_item", False,
         lambda it: put(it, ConditionExpression="attribute_not_exists(#k)", ExpressionAttributeNames={"#k": pk})),
        ("copy: no condition (floor; NOT fenced)", "put_item", False, lambda it: put(it)),
        ("ttl: version fence AND own-TTL clause (as sent)", "update_item", True,
         lambda it: ttl(it, unchanged(_VERSION, pk), " AND (attribute_not_exists(#ttl) OR #ttl > :exp)",
                        {"#ttl": ttl_attr}, {":exp": exp})),
        ("ttl: same condition, 1-letter placeholders", "update_item", True,
         lambda it: {"Key": key(it), "UpdateExpression": "SET #t = :e",
                     "ConditionExpression": "(#v = :v) AND (attribute_not_exists(#t) OR #t > :e)",
                     "ExpressionAttributeNames": {"#v": "_rs_v", "#t": ttl_attr},
                     "ExpressionAttributeValues": {":v": {"S": _VERSION}, ":e": exp}}),
        ("ttl: version fence only (NOT the same guarantee)", "update_item", True,
         lambda it: ttl(it, unchanged(_VERSION, pk), "", {"#ttl": ttl_attr}, {":exp": exp})),
        ("delete: version fence (as sent)", "delete_item", True,
         lambda it: {"Key": key(it), "ReturnConsumedCapacity": "TOTAL", **unchanged(_VERSION, pk).kwargs()}),
        ("delete: no condition (floor; NOT fenced)", "delete_item", True,
         lambda it: {"Key": key(it), "ReturnConsumedCapacity": "TOTAL"}),
    ]


def run_variants(server, endpoint: str, items: list[dict], keys, ttl_attr: str, concurrency: int, args) -> list:
    """Each shape: the same items sent by hand, ``concurrency`` threads, in its own window (onto
    nothing for PutItem; onto the items preloaded with a version, outside the window, for the others);
    the shapes alternate over ``--variant-rounds`` rounds, on a fresh table each time."""
    from concurrent.futures import ThreadPoolExecutor

    from reshard.aws.local import create_table

    key_attrs = [keys.partition] + ([keys.sort] if keys.sort else [])
    out: dict[str, list] = {}
    table_no = 0
    every = shapes(key_attrs, ttl_attr)
    for r in range(args.variant_rounds):
        # Each round starts at another shape: none is always the first after a pause or a busy spell.
        for label, operation, preload, build in every[r % len(every):] + every[:r % len(every)]:
            d = client(endpoint, args.latency_ms)
            counter = RequestCounter(d)
            table_no += 1
            table = f"variant{table_no}"
            create_table(d, table, keys)
            if preload:
                d.batch_write(table, [{"PutRequest": {"Item": dict(it, _rs_v={"S": _VERSION})}} for it in items])

            def one(item, d=d, table=table, operation=operation, build=build):
                d.call(operation, TableName=table, **build(item))

            def send(one=one):
                with ThreadPoolExecutor(concurrency) as pool:
                    list(pool.map(one, items))
                return len(items), {}

            out.setdefault(label, []).append(Window.measure("variant", label, server, counter, send))
    return [(label, out[label]) for label, *_ in every]


# --------------------------------------------------------------------------- report

def us(seconds: float, count: int) -> float:
    return seconds / count * 1e6 if count else 0.0


def table(title: str, rows: list[tuple], header: tuple) -> None:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    print(f"\n{title}")
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))))


def matrix(title: str, per_op: dict[str, list[tuple[str, float]]], totals: dict[str, float], top: int) -> list:
    """One table: the ``top`` components (by their largest figure in any column) by operation, µs and share."""
    ops = list(per_op)
    best: collections.Counter = collections.Counter()
    for rows in per_op.values():
        for k, v in rows:
            best[k] = max(best[k], v)
    names = [k for k, _ in best.most_common(top)]
    lookup = {op: dict(rows) for op, rows in per_op.items()}
    rows = []
    for k in names:
        rows.append((k, *(f"{lookup[op].get(k, 0):.0f} {lookup[op].get(k, 0) / (totals[op] or 1):4.0%}"
                          for op in ops)))
    rows.append(("(the rest)", *(f"{totals[op] - sum(lookup[op].get(k, 0) for k in names):.0f}" for op in ops)))
    rows.append(("total", *(f"{totals[op]:.0f}" for op in ops)))
    table(title, rows, ("component", *ops))
    return rows


def measure_ops(server, ops: list[str], args, label: str) -> dict[str, Window]:
    """Each operation's real job on ``server``, one after the other, every table set up first."""
    setup = client(server.endpoint)
    for op in ops:  # every table first: the windows then see a warmed-up server
        set_up(setup, op, f"{op}-{label}", args.items, args.segments)
    out = {}
    for op in ops:
        d = client(server.endpoint, args.latency_ms)
        counter = RequestCounter(d)
        out[op] = Window.measure(op, label, server, counter,
                                 lambda: (run_op(d, op, f"{op}-{label}", args.segments, args.concurrency), {}))
    return out


def cprofile_ops(server, ops: list[str], args, work: pathlib.Path) -> dict[str, tuple[Window, dict]]:
    """Each operation's job again, in a child process under cProfile (tables set up here first)."""
    setup = client(server.endpoint)
    for op in ops:
        set_up(setup, op, f"{op}-cprofile", args.items, args.segments)
    out = {}
    for op in ops:
        stats_file = work / f"client-{op}.pstats"

        def child(op=op, stats_file=stats_file):
            proc = subprocess.run(
                [sys.executable, __file__, "--cprofile-child", op, server.endpoint, f"{op}-cprofile",
                 str(args.segments), str(args.concurrency), str(args.latency_ms), str(stats_file)],
                capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
            if proc.returncode:
                raise SystemExit(f"cProfile child failed: {proc.stderr[-2000:]}")
            return json.loads(proc.stdout.strip().splitlines()[-1])["items"], {}
        w = Window.measure(op, "cprofile", server, None, child)
        out[op] = (w, client_split(pstats.Stats(str(stats_file)), args.top))
    return out


def variant_items(n: int) -> tuple[list[dict], object]:
    """n new-layout items of the invoices example (what the copy writes) and its migration."""
    from benchmarks._support import migration_text, old_items
    from reshard.core.layout import KeyMapper
    from reshard.core.migration import parse
    m = parse(migration_text("invoices", "variants"), "<invoices>")
    mapper = KeyMapper(m)
    return [mapper.remap(it)[0] for it in old_items(mapper, "invoices", n, seed=7)], m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=2000, help="items per job's table")
    ap.add_argument("--segments", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--latency-ms", type=float, default=3.0, help="emulated round trip per request, as the "
                                                                   "other benchmarks (a before-send sleep)")
    ap.add_argument("--interval-us", type=int, default=200, help="node's sampling interval")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--ops", default="copy,ttl,delete,scan", help="of: " + ", ".join(OPS))
    ap.add_argument("--no-reference", action="store_true",
                    help="skip the same jobs on an unprofiled server (then the µs are the profiled one's)")
    ap.add_argument("--no-cprofile", action="store_true", help="skip the client's cProfile runs")
    ap.add_argument("--no-variants", action="store_true", help="skip the hand-sent request shapes")
    ap.add_argument("--variant-items", type=int, default=1500, help="requests per shape and round")
    ap.add_argument("--variant-rounds", type=int, default=3, help="rounds over the shapes (alternated)")
    ap.add_argument("--keep", help="keep the .cpuprofile and the client's pstats in this directory")
    ap.add_argument("--cprofile-child", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cprofile_child:
        op, endpoint, name, seg, conc, lat, out = args.cprofile_child
        cprofile_child(op, endpoint, name, int(seg), int(conc), float(lat), out)
        return
    ops = [o for o in args.ops.split(",") if o]
    if set(ops) - set(OPS):
        ap.error(f"--ops: unknown {sorted(set(ops) - set(OPS))}")
    load0 = os.getloadavg()

    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(args.keep) if args.keep else pathlib.Path(tmp)
        prof_dir = work / "cpuprofile"
        prof_dir.mkdir(parents=True, exist_ok=True)
        for old in prof_dir.glob("*.cpuprofile"):
            old.unlink()
        reference: dict[str, Window] = {}
        if not args.no_reference:
            with DynaliteServer(pathlib.Path(tmp) / "plain") as plain:
                reference = measure_ops(plain, ops, args, "plain")
        server = DynaliteServer(pathlib.Path(tmp) / "profiled", cpu_profile_dir=prof_dir,
                                cpu_profile_interval_us=args.interval_us)
        with server:
            clean = measure_ops(server, ops, args, "profiled")
            profiled_client = {} if args.no_cprofile else cprofile_ops(server, ops, args, work)
            variant_windows = []
            if not args.no_variants:
                items, m = variant_items(args.variant_items)
                variant_windows = run_variants(server, server.endpoint, items, m.keys, m.cleanup.ttl_attribute,
                                               args.concurrency, args)
        profile = load_profile(prof_dir)
    load1 = os.getloadavg()

    results = {"params": vars(args) | {"cprofile_child": None}, "loadavg_start": load0, "loadavg_end": load1,
               "cores": os.cpu_count(), "node": subprocess.run(["node", "--version"], capture_output=True,
                                                              text=True).stdout.strip(), "ops": {}, "variants": []}
    summary, server_parts, server_totals, client_parts, client_totals = [], {}, {}, {}, {}
    for op in ops:
        w = clean[op]
        n = w.items
        ref = reference.get(op)
        split = server_split(profile, samples_in(profile, w.start, w.end), args.top)
        # The samples give shares of the main thread's time (they also tick while the process waits for a
        # core on a loaded machine); the µs are those shares of its CPU, unprofiled where measured.
        main_us = us(ref.server_main_cpu if ref else w.server_main_cpu, ref.items if ref else n)
        busy = split["busy_us"] or 1
        entry = {
            "what": OPS[op][0], "items": n, "requests": w.requests, "seconds": round(w.end - w.start, 3),
            "items_per_s": round(n / (w.end - w.start), 1),
            "client_cpu_us_per_item": round(us(w.client_cpu, n), 1),
            "server_cpu_us_per_item_profiled": round(us(w.server_main_cpu + w.server_other_cpu, n), 1),
            "server_main_thread_us_per_item_profiled": round(us(w.server_main_cpu, n), 1),
            "server_other_threads_us_per_item_profiled": round(us(w.server_other_cpu, n), 1),
            "server_busy_fraction_profiled": round((w.server_main_cpu + w.server_other_cpu) / (w.end - w.start), 3),
            "samples_busy_us_per_item": round(busy / n, 1),
            # ≈ 1 when the window's samples cover it (the two clocks agree); idle included
            "profile_coverage": round((split["busy_us"] + split["idle_us"]) / ((w.end - w.start) * 1e6), 3),
            "server_components_us_per_item": [(k, round(v / busy * main_us, 1)) for k, v in split["components"]],
            "server_components_share": [(k, round(v / busy, 4)) for k, v in split["components"]],
            "server_top_functions_share": [(k, round(v / busy, 4)) for k, v in split["functions"]],
        }
        if ref:
            entry |= {"reference_items_per_s": round(ref.items / (ref.end - ref.start), 1),
                      "reference_client_cpu_us_per_item": round(us(ref.client_cpu, ref.items), 1),
                      "server_cpu_us_per_item": round(us(ref.server_main_cpu + ref.server_other_cpu, ref.items), 1),
                      "server_main_thread_us_per_item": round(us(ref.server_main_cpu, ref.items), 1),
                      "server_other_threads_us_per_item": round(us(ref.server_other_cpu, ref.items), 1)}
        server_parts[op], server_totals[op] = entry["server_components_us_per_item"], main_us
        if op in profiled_client:
            pw, cs = profiled_client[op]
            total = cs["total_s"] or 1
            cpu = entry.get("reference_client_cpu_us_per_item", entry["client_cpu_us_per_item"])
            entry["client_cprofile_items"] = pw.items
            entry["client_components_us_per_item"] = [(k, round(v / total * cpu, 1)) for k, v in cs["components"]]
            entry["client_cprofile_cumulative_share"] = [(k, round(v / total, 3)) for k, v in cs["cumulative"]]
            entry["client_cprofile_self_share"] = [(k, round(v / total, 3)) for k, v in cs["self"]]
            client_parts[op], client_totals[op] = entry["client_components_us_per_item"], cpu
        results["ops"][op] = entry
        summary.append((entry["what"], n, f"{entry.get('reference_items_per_s', entry['items_per_s']):.0f}",
                        f"{entry.get('reference_client_cpu_us_per_item', entry['client_cpu_us_per_item']):.0f}",
                        f"{entry.get('server_cpu_us_per_item', 0):.0f}",
                        f"{entry.get('server_main_thread_us_per_item', 0):.0f}",
                        f"{entry.get('server_other_threads_us_per_item', 0):.0f}",
                        f"{1e6 / main_us:.0f}" if main_us else "-",
                        f"{entry['server_cpu_us_per_item_profiled']:.0f}"))
    print(f"\nnode {results['node']}, {results['cores']} cores, load average {load0[0]:.1f} → {load1[0]:.1f}, "
          f"{args.latency_ms:g} ms emulated round trip, --concurrency {args.concurrency}, "
          f"{args.segments} segments, {args.items} items per job, sampling every {args.interval_us} µs")
    table("CPU per item, µs: client (process_time) and dynalite (/proc; unprofiled server unless marked)",
          summary, ("operation", "items", "items/s", "client", "dynalite", "main", "threads", "cap/s", "profiled"))
    coverage = [results["ops"][op]["profile_coverage"] for op in ops]
    print("  main: its JavaScript thread; threads: the others (libuv's pool, where classic-level's LevelDB\n"
          "  gets/puts/iterators run, and V8's GC/compiler helpers); cap/s: items/s the main thread allows\n"
          "  (one core, nothing else on it); profiled: all of it under --cpu-prof. The profile's samples\n"
          f"  cover {min(coverage):.0%}–{max(coverage):.0%} of each job's wall time (the two clocks agree).")
    matrix("dynalite's main thread by component, µs per item and share (profile shares × its CPU; idle excluded)",
           server_parts, server_totals, args.top)
    for op in ops:
        e = results["ops"][op]
        table(f"[{op}] dynalite top self-time functions (share of the main thread; requests: "
              f"{', '.join(f'{k} {v}' for k, v in sorted(e['requests'].items()))})",
              [(k[:100], f"{v:.1%}", f"{v * server_totals[op]:.0f}") for k, v in e["server_top_functions_share"]],
              ("function", "share", "≈µs"))
    if client_parts:
        matrix("client by component, µs per item and share (cProfile thread-CPU shares × process_time per item)",
               client_parts, client_totals, args.top)
        for op in client_parts:
            e = results["ops"][op]
            table(f"[{op}] client top cumulative functions (share of the client's CPU)",
                  [(k[:100], f"{v:.0%}") for k, v in e["client_cprofile_cumulative_share"]], ("function", "share"))
    if variant_windows:
        rows = []
        for label, ws in variant_windows:
            runs = []
            for w in ws:
                sv = server_split(profile, samples_in(profile, w.start, w.end), args.top)
                comp, busy = dict(sv["components"]), sv["busy_us"] or 1
                main_us = us(w.server_main_cpu, w.items)
                runs.append({"server_cpu_us_per_item": round(us(w.server_main_cpu + w.server_other_cpu, w.items), 1),
                             "server_main_thread_us_per_item": round(main_us, 1),
                             "server_parser_us_per_item": round(sum(comp.get(k, 0) for k in PARSERS) / busy * main_us, 1),
                             "server_storage_us_per_item": round(comp.get(STORAGE, 0) / busy * main_us, 1),
                             "client_cpu_us_per_item": round(us(w.client_cpu, w.items), 1),
                             "items": w.items, "requests": w.requests,
                             "server_components_share": [(k, round(v / busy, 4)) for k, v in sv["components"]]})
            med = {k: statistics.median(r[k] for r in runs) for k in
                   ("server_cpu_us_per_item", "server_main_thread_us_per_item", "server_parser_us_per_item",
                    "server_storage_us_per_item", "client_cpu_us_per_item")}
            results["variants"].append({"shape": label, "median": med, "runs": runs})
            rows.append((label, f"{med['server_cpu_us_per_item']:.0f}",
                         f"{min(r['server_cpu_us_per_item'] for r in runs):.0f}–"
                         f"{max(r['server_cpu_us_per_item'] for r in runs):.0f}",
                         f"{med['server_parser_us_per_item']:.0f}", f"{med['server_storage_us_per_item']:.0f}",
                         f"{med['client_cpu_us_per_item']:.0f}"))
        table(f"Request shapes sent by hand: µs per request, median of {args.variant_rounds} rounds of "
              f"{args.variant_items} (profiled server)",
              rows, ("shape", "dynalite", "range", "parsers", "storage", "client"))
    out = ROOT / "benchmarks" / "results" / "profile.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nwritten to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
