"""Local DynamoDB servers, so nothing here needs an AWS account.

:class:`EmbeddedDynamoDB` is moto's threaded server in a child process (``pip install
'reshard[demo]'`` brings it) for `reshard demo` and quick tries: fine for a few thousand items.
:class:`DynaliteServer` is a dynalite process (``npm install`` in a checkout) that
persists to disk and survives its clients being killed: the integration tests and the
benchmarks use it. Both listen on a free 127.0.0.1 port.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import time

from reshard import errors
from reshard.core.migration import Keys

#: dynalite as ``npm install`` puts it in a checkout of reshard (package.json).
DYNALITE_CLI = pathlib.Path(__file__).resolve().parents[2] / "node_modules" / "dynalite" / "cli.js"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: The embedded server's process: moto's threaded server until its stdin closes (so it never
#: outlives the demo, even one that is killed), werkzeug's per-request log off, moto's
#: per-request costs cut (reshard/aws/moto_speedups.py; argv[2] is where reshard is).
_MOTO_CHILD = """
import logging, sys
sys.path.insert(0, sys.argv[2])
logging.getLogger("werkzeug").setLevel(logging.ERROR)
from reshard.aws.moto_speedups import install
install()
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False)
server.start()
sys.stdin.read()
server.stop()
"""


class EmbeddedDynamoDB:
    """moto's server in a child process; use as a context manager.

    A process of its own, not a thread: in the demo's process, moto's request handling
    shared one interpreter lock with the application threads and the jobs it serves,
    and most of the demo's wall time was the two waiting for each other.
    """

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self._err = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> str:
        import importlib.util
        import sys
        if importlib.util.find_spec("moto") is None or importlib.util.find_spec("werkzeug") is None:
            raise errors.BadInput("the embedded DynamoDB needs moto's server: "
                                  "python3 -m pip install -e '.[demo]' (or pass --endpoint-url)")
        import tempfile
        self._err = tempfile.TemporaryFile()  # a file, not a pipe: a chatty server never blocks on it
        self.proc = subprocess.Popen([sys.executable, "-c", _MOTO_CHILD, str(self.port),
                                      str(pathlib.Path(__file__).resolve().parents[2])], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=self._err)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._err.seek(0)
                err = self._err.read().decode(errors="replace").strip().splitlines()
                self.stop()
                raise errors.ReshardError(f"the embedded DynamoDB server exited: {err[-1] if err else '?'}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self.endpoint_url
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise errors.ReshardError(f"the embedded DynamoDB server did not listen on {self.port} within {timeout:g}s")

    def notes(self) -> list[str]:
        """What the server said on starting that a person should know (the moto speed-ups'
        refusal on an unchecked moto: the same answers, slower)."""
        if self._err is None:
            return []
        self._err.seek(0)
        text = self._err.read().decode(errors="replace")
        self._err.seek(0, 2)
        return [line.split(":", 2)[-1].strip() if line.startswith("WARNING:") else line.strip()
                for line in text.splitlines() if "moto speed-ups" in line]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.terminate()  # an in-memory server: nothing to save
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            proc.stdin.close()
        if self._err is not None:
            self._err.close()
            self._err = None

    def __enter__(self) -> "EmbeddedDynamoDB":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def dynalite_available() -> bool:
    return DYNALITE_CLI.is_file()


#: How a profiled dynalite runs its cli: SIGTERM/SIGINT end node with a normal exit, the only
#: exit on which ``--cpu-prof`` writes its profile (node's default on those signals is to die
#: without writing it). argv[1] is the cli, so the cli sees its own arguments as usual.
_EXIT_NORMALLY_ON_SIGNAL = ("for (const s of ['SIGTERM', 'SIGINT']) process.on(s, () => process.exit(0)); "
                            "require(process.argv[1])")


class DynaliteServer:
    """A dynalite process on 127.0.0.1 persisting to ``path`` (survives kill -9 of clients).

    ``restart()`` keeps the same port and data directory, for crash/resume tests.
    ``cpu_profile_dir``: run node under its sampling CPU profiler (``--cpu-prof``, one sample
    every ``cpu_profile_interval_us``); the ``.cpuprofile`` is written there when the server
    stops (``benchmarks/profile.py``). Off by default, and the default start is unchanged.
    """

    def __init__(self, path: pathlib.Path | str, port: int | None = None,
                 cpu_profile_dir: pathlib.Path | str | None = None, cpu_profile_interval_us: int = 1000):
        self.path = pathlib.Path(path)
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.log = self.path / "dynalite.log"
        self.cpu_profile_dir = pathlib.Path(cpu_profile_dir) if cpu_profile_dir is not None else None
        self.cpu_profile_interval_us = cpu_profile_interval_us

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The command that starts the server."""
        cli = [str(DYNALITE_CLI), "--host", "127.0.0.1", "--port", str(self.port), "--path", str(self.path / "data"),
               "--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0"]
        if self.cpu_profile_dir is None:
            return ["node", *cli]
        return ["node", "--cpu-prof", "--cpu-prof-dir", str(self.cpu_profile_dir),
                "--cpu-prof-interval", str(int(self.cpu_profile_interval_us)), "-e", _EXIT_NORMALLY_ON_SIGNAL, *cli]

    def start(self, timeout: float = 20.0) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(self.command(), stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dynalite exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"dynalite did not listen on {self.port} within {timeout}s")

    def stop(self) -> None:
        # A profiled server writes its profile as it exits: seconds for a long run.
        wait = 5 if self.cpu_profile_dir is None else 60
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()


def create_table(dynamo, table: str, keys: Keys, timeout: float = 30.0, poll: float = 0.05,
                 types: dict[str, str] | None = None) -> None:
    """An on-demand table with the key attributes a migration file's ``[keys]`` names
    (string keys, as the layouts write them, unless ``types`` says ``N`` or ``B`` for an
    attribute), for tries, tests and benchmarks.

    Returns once the table is ACTIVE (a bounded poll of DescribeTable through the choke
    point): dynalite, like DynamoDB, answers CreateTable while the table is still CREATING,
    and under load the first requests that follow failed with ResourceNotFound.
    """
    schema = [{"AttributeName": keys.partition, "KeyType": "HASH"}]
    types = types or {}
    attrs = [{"AttributeName": keys.partition, "AttributeType": types.get(keys.partition, "S")}]
    if keys.sort:
        schema.append({"AttributeName": keys.sort, "KeyType": "RANGE"})
        attrs.append({"AttributeName": keys.sort, "AttributeType": types.get(keys.sort, "S")})
    dynamo.call("create_table", TableName=table, KeySchema=schema, AttributeDefinitions=attrs,
                BillingMode="PAY_PER_REQUEST")
    wait_active(dynamo, table, timeout, poll)


def wait_active(dynamo, table: str, timeout: float = 30.0, poll: float = 0.05) -> None:
    """Poll DescribeTable until ``table`` is ACTIVE; AWSError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    status = "missing"
    while True:
        try:
            status = dynamo.call("describe_table", TableName=table)["Table"].get("TableStatus", "?")
        except errors.ResourceNotFound:
            status = "missing"  # not visible yet right after CreateTable on a busy server
        if status == "ACTIVE":
            return
        if time.monotonic() >= deadline:
            raise errors.AWSError("create_table", "Timeout", f"table {table} is {status}, not ACTIVE, after {timeout}s")
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
