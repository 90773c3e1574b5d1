"""The real-AWS acceptance check (tests/aws) deletes what it created when it is interrupted.

It runs here against dynalite behind the fidelity proxy (``RESHARD_AWS_TEST_ENDPOINT``), as
a user would run it against AWS, and is interrupted: by SIGINT (Ctrl-C) in the middle of the
migration (the shim serving, the next ``reshard`` command running), and by SIGTERM right after
it seeded its table.
Both tables it made must be gone afterwards. (The whole check, uninterrupted, takes a few
minutes on a local server: ``RESHARD_AWS_TEST_REGION=us-east-1
RESHARD_AWS_TEST_ENDPOINT=http://127.0.0.1:PORT python3 -m pytest tests/aws -s -n 0``.)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from reshard.aws.fidelity import FidelityProxy

from tests.conftest import ROOT


def run_until(endpoint: str, line_pattern: str, sig: int, timeout: float = 300) -> tuple[int, str]:
    """Run tests/aws against ``endpoint``; send ``sig`` once a line matches; its exit code and output."""
    env = dict(os.environ, RESHARD_AWS_TEST_REGION="us-east-1", RESHARD_AWS_TEST_ENDPOINT=endpoint,
               RESHARD_AWS_TEST_ITEMS="60", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "tests/aws", "-s", "-q", "-n", "0", "-p", "no:cacheprovider"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    deadline = time.monotonic() + timeout
    try:
        for line in proc.stdout:
            out.append(line)
            if re.search(line_pattern, line):
                proc.send_signal(sig)
                break
            if time.monotonic() > deadline:
                break
        rest, _ = proc.communicate(timeout=timeout)
        out.append(rest)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, "".join(out)


def tables(dynalite, prefix: str) -> list[str]:
    return [t for t in dynalite.call("list_tables", Limit=100).get("TableNames", []) if t.startswith(prefix)]


@pytest.mark.parametrize("sig, when", [(signal.SIGINT, r"\[aws\] phase dual_read"),
                                       (signal.SIGTERM, r"\[aws\] seeded")])
def test_an_interrupted_acceptance_run_deletes_both_tables(dynalite, dynalite_server, sig, when):
    with FidelityProxy(dynalite_server.endpoint) as proxy:
        code, out = run_until(proxy.endpoint, when, sig)
    created = re.search(r"\[aws\] created table (\S+) \(and (\S+) at", out)
    assert created, out[-3000:]
    table, control = created.groups()
    assert code != 0 and "KeyboardInterrupt" in out, out[-3000:]
    for name in (table, control):
        assert not tables(dynalite, name), f"{name} left behind: {out[-3000:]}"
    assert f"deleted table {table}" in out
