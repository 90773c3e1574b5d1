"""``DynaliteServer(cpu_profile_dir=...)``: dynalite under node's CPU profiler, for benchmarks/profile.py.

The default start must stay exactly what it was (every other test runs on it); the profiled
one must answer requests and, stopped the usual way (SIGTERM to its process group), exit
normally so that node writes the ``.cpuprofile``.
"""

from __future__ import annotations

import json

from reshard.aws.dynamo import Dynamo
from reshard.aws.local import DYNALITE_CLI, DynaliteServer


def test_default_command_unchanged(tmp_path):
    server = DynaliteServer(tmp_path, port=4567)
    assert server.command() == [
        "node", str(DYNALITE_CLI), "--host", "127.0.0.1", "--port", "4567", "--path", str(tmp_path / "data"),
        "--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0"]


def test_profiled_server_serves_and_writes_its_profile_on_stop(tmp_path):
    prof = tmp_path / "prof"
    server = DynaliteServer(tmp_path / "srv", cpu_profile_dir=prof, cpu_profile_interval_us=500)
    with server:
        proc = server.proc
        d = Dynamo(endpoint_url=server.endpoint, region="us-east-1", connect_timeout=2, read_timeout=5)
        assert d.call("list_tables")["TableNames"] == []
    assert proc.returncode == 0  # a normal exit on SIGTERM, not death by the signal
    [file] = prof.glob("*.cpuprofile")
    profile = json.loads(file.read_text())
    assert profile["samples"] and len(profile["timeDeltas"]) == len(profile["samples"])
    urls = {n["callFrame"]["url"] for n in profile["nodes"]}
    assert any("dynalite" in u for u in urls), "the profile does not cover dynalite's own code"
