"""Start and stop DynamoDB-compatible server processes for tests and benchmarks."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
DYNALITE_CLI = ROOT / "node_modules" / "dynalite" / "cli.js"


def dynalite_available() -> bool:
    return DYNALITE_CLI.is_file()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DynaliteServer:
    """A dynalite process on 127.0.0.1 persisting to ``path`` (survives kill -9 of clients).

    ``restart()`` keeps the same port and data directory, for crash/resume tests.
    """

    def __init__(self, path: pathlib.Path | str, port: int | None = None):
        self.path = pathlib.Path(path)
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.log = self.path / "dynalite.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        data = self.path / "data"
        cmd = ["node", str(DYNALITE_CLI), "--host", "127.0.0.1", "--port", str(self.port), "--path", str(data),
               "--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0"]
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
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
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(5)
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
