"""Compare-and-set races and the phase commands against dynalite (a real server).

Threads share one client; processes are real ``python -m reshard`` command lines.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import pytest

from reshard.aws.local import wait_active
from reshard import errors

from reshard.control.store import ControlStore
from reshard.core.migration import parse
from reshard.core.phases import Action
from reshard.control.transition import transition
from reshard.control import fleet

ROOT = pathlib.Path(__file__).resolve().parents[2]
SENSOR = (ROOT / "migrations" / "0001_sensor_events.toml").read_text()
LOSER = re.compile(r"^reshard: error: (?P<who>\S+) already moved it from (?P<acted_phase>\w+) to (?P<phase>\w+) at "
                   r"\S+Z(?P<after> \(after this command started\))?; nothing done: '(?P<mid>[^']+)' is in \w+ "
                   r"\(phase version (?P<v>\d+)\); check `reshard status`, then run the command again if you still "
                   r"mean it from there$")


@pytest.fixture
def setup(dynalite, unique_name, tmp_path, monkeypatch):
    """A data table, a migration file for it, and a control table name, all unique to the test."""
    table = f"{unique_name}-data"
    mid = f"{unique_name}-mig"
    dynalite.call("create_table", TableName=table, BillingMode="PAY_PER_REQUEST",
                  KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}, {"AttributeName": "SK", "KeyType": "RANGE"}],
                  AttributeDefinitions=[{"AttributeName": "PK", "AttributeType": "S"},
                                        {"AttributeName": "SK", "AttributeType": "S"}])
    wait_active(dynalite, table)  # dynalite answers CreateTable before the table takes writes
    text = SENSOR.replace('table = "SensorEvents"', f'table = "{table}"').replace(
        'id = "sensor-events-16-to-32"', f'id = "{mid}"')
    path = tmp_path / "m.toml"
    path.write_text(text)
    store = ControlStore(dynalite, f"{unique_name}-ctl")
    return store, parse(text, str(path)), str(path)


def assert_history_consistent(store: ControlStore, mid: str) -> list:
    hist = store.history(mid)
    assert [t.phase_version for t in hist] == list(range(1, len(hist) + 1))  # no gap, no duplicate
    for prev, t in zip(hist, hist[1:]):
        assert t.from_phase == prev.to_phase  # each transition starts where the last one ended
    assert hist[-1].to_phase == store.load_state(mid).phase.value
    return hist


class BarrierStore(ControlStore):
    """Every racer reads the state, then waits for the others before its conditional write,
    so all of them contend at the compare-and-set itself."""

    def __init__(self, *a, barrier: threading.Barrier, **kw):
        super().__init__(*a, **kw)
        self.barrier = barrier

    def set_phase(self, state, target, action, who):
        self.barrier.wait(timeout=20)
        return super().set_phase(state, target, action, who)


def race(n: int, fn) -> list:
    results: list = [None] * n

    def run(i):
        try:
            results[i] = ("won", fn(i))
        except errors.ReshardError as e:
            results[i] = ("lost", e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return results


def test_eight_threads_same_advance_exactly_one_wins(setup):
    store, m, _ = setup
    store.register(m, who="alice@h0")
    barrier = threading.Barrier(8)
    racers = [BarrierStore(store.dynamo, store.table, barrier=barrier) for _ in range(8)]
    results = race(8, lambda i: transition(racers[i], m.id, Action.ADVANCE, who=f"op{i}@h{i}", allow_no_shims=True))
    won = [i for i, r in enumerate(results) if r[0] == "won"]
    assert len(won) == 1
    winner = f"op{won[0]}@h{won[0]}"
    for kind, e in results:
        if kind == "lost":
            assert isinstance(e, errors.ConcurrentChange), e
            assert str(e).startswith(f"{winner} already moved it from planned to dual_write at "), e
            assert f"; nothing done: '{m.id}' is in dual_write (phase version 2)" in str(e)
    hist = assert_history_consistent(store, m.id)
    assert [(t.to_phase, t.who) for t in hist] == [("planned", "alice@h0"), ("dual_write", winner)]


def test_unpinned_racing_advances_each_move_one_phase(setup):
    """Racers that read at different moments may each win a different step; the history stays a chain."""
    store, m, _ = setup
    store.register(m)
    results = race(8, lambda i: transition(ControlStore(store.dynamo, store.table), m.id, Action.ADVANCE,
                                           who=f"op{i}", allow_no_shims=True))
    steps = [(before.phase, after.phase) for kind, (before, after) in
             ((k, r) for k, r in results if k == "won")]
    assert len(set(steps)) == len(steps) >= 1  # nobody moved the same step twice
    for before, after in steps:
        assert after.value == {"planned": "dual_write", "dual_write": "dual_read", "dual_read": "backfill"}[before.value]
    for kind, e in results:
        if kind == "lost":  # lost the compare-and-set, or came after the last possible step
            assert isinstance(e, errors.RefusedTransition) and (
                isinstance(e, errors.ConcurrentChange) or "the backfill has not run" in str(e)), e
    hist = assert_history_consistent(store, m.id)
    assert len(hist) == 1 + len(steps)
    assert sorted((t.from_phase, t.to_phase) for t in hist[1:]) == sorted((b.value, a.value) for b, a in steps)


def cli(endpoint: str, *args: str) -> list[str]:
    # No application writes these tables: the operator vouches for the empty fleet.
    vouch = ["--allow-no-shims"] if args and args[0] in ("advance", "rollback", "abort") else []
    return [sys.executable, "-m", "reshard", "--endpoint-url", endpoint, *args, *vouch]


def cli_env(who: str | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x",
               AWS_DEFAULT_REGION="us-east-1")
    if who:
        env["RESHARD_OPERATOR"] = who
    return env


def run_cli(endpoint: str, *args: str, who: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cli(endpoint, *args), capture_output=True, text=True, env=cli_env(who), timeout=60)


def test_four_advance_processes_at_once(setup, dynalite_server):
    """Four operators run `advance --wait` while a shim lags; when it catches up all four
    try the same transition: one moves the migration, three exit 2 with the one clear line."""
    store, m, _ = setup
    store.register(m, who="alice@h0")
    fleet.heartbeat(store, m.id, "i-1", "planned", 0, host="app1", pid=41, liveness_seconds=600)
    procs = [subprocess.Popen(cli(dynalite_server.endpoint, "advance", m.id, "--wait", "40", "--output", "json",
                                  "--control-table", store.table),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(f"op{i}@h{i}"))
             for i in range(4)]
    try:
        for p in procs:  # each has read phase version 1 and is waiting for the shim
            line = p.stderr.readline()
            assert line.startswith("waiting up to 40s for 1 live shim(s) to acknowledge planned v1"), line
        fleet.heartbeat(store, m.id, "i-1", "planned", 1, host="app1", pid=41)
        deadline = time.monotonic() + 30
        while store.load_state(m.id).phase_version < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        # The shim catches up with the new phase too, so the winner's second wait ends.
        fleet.heartbeat(store, m.id, "i-1", "dual_write", 2, host="app1", pid=41)
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 2, 2, 2], outs
    winner = codes.index(0)
    moved = json.loads(outs[winner][0])
    assert (moved["from"], moved["to"], moved["phase_version"]) == ("planned", "dual_write", 2)
    assert moved["fleet"]["acknowledged"] is True and moved["fleet"]["live"] == 1
    for i, (out, err) in enumerate(outs):
        if i == winner:
            continue
        assert out == ""
        (line,) = err.strip().splitlines()
        g = LOSER.match(line)
        assert g, line
        assert (g["who"], g["mid"], g["acted_phase"], g["phase"], g["v"]) == (f"op{winner}@h{winner}", m.id,
                                                                              "planned", "dual_write", "2")
    hist = assert_history_consistent(store, m.id)
    assert [(t.to_phase, t.who) for t in hist] == [("planned", "alice@h0"), ("dual_write", f"op{winner}@h{winner}")]


def test_four_plain_advance_processes_leave_a_chain(setup, dynalite_server):
    """Without --wait, each process acts on what it reads: every winner moves exactly one phase."""
    store, m, _ = setup
    store.register(m)
    transition(store, m.id, Action.ADVANCE, allow_no_shims=True)  # dual_write: at most two steps left before the backfill gate
    procs = [subprocess.Popen(cli(dynalite_server.endpoint, "advance", m.id, "--control-table", store.table),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(f"op{i}"))
             for i in range(4)]
    outs = [p.communicate(timeout=60) for p in procs]
    steps = []
    for p, (out, err) in zip(procs, outs):
        if p.returncode == 0:
            g = re.search(r"moved (\w+) -> (\w+) \(phase version (\d+)\)", out)
            steps.append((g[1], g[2], int(g[3])))
        else:
            assert p.returncode == 2 and out == ""
            (line,) = err.strip().splitlines()
            assert LOSER.match(line) or "advance refused" in line and "the backfill has not run" in line, line
    assert 1 <= len(steps) <= 2 and len({s[2] for s in steps}) == len(steps)
    hist = assert_history_consistent(store, m.id)
    assert sorted((t.from_phase, t.to_phase, t.phase_version) for t in hist[2:]) == sorted(steps)


def test_the_commands_from_the_command_line(setup, dynalite_server):
    store, m, path = setup
    ep, ct = dynalite_server.endpoint, ["--control-table", store.table]
    r = run_cli(ep, "start", path, *ct, who="alice@h1")
    assert r.returncode == 0, r.stderr
    assert f"created control table '{store.table}'" in r.stdout and "phase planned" in r.stdout
    r = run_cli(ep, "start", path, *ct)
    assert r.returncode == 0 and "already registered with this file" in r.stdout
    r = run_cli(ep, "advance", *ct, who="bob@h2")
    assert r.returncode == 0 and "moved planned -> dual_write (phase version 2)" in r.stdout
    fleet.heartbeat(store, m.id, "i-7", "dual_write", 2, host="app7", pid=70)
    r = run_cli(ep, "advance", path, *ct, who="bob@h2")
    assert r.returncode == 0 and "moved dual_write -> dual_read" in r.stdout
    assert "NOT caught up" in r.stdout and "i-7 (app7 pid 70, on dual_write v2)" in r.stdout
    r = run_cli(ep, "rollback", m.id, *ct, who="carol@h3")
    assert r.returncode == 2 and "rollback refused" in r.stderr and "`reshard wait` waits for them" in r.stderr
    fleet.heartbeat(store, m.id, "i-7", "dual_read", 3, host="app7", pid=70)
    r = run_cli(ep, "rollback", m.id, *ct, who="carol@h3")
    assert r.returncode == 0, r.stderr
    r = run_cli(ep, "status", *ct)
    assert r.returncode == 0
    assert "phase:     dual_write  (phase version 4, since" in r.stdout and "by carol@h3" in r.stdout
    assert "shims:     1 live (1 lagging behind phase version 4), 0 expired" in r.stdout
    assert re.search(r"i-7\s+app7 pid 70\s+on dual_read v3 .* LAGGING", r.stdout), r.stdout
    assert "advance:   to dual_read refused now:" in r.stdout
    r = run_cli(ep, "status", "--output", "json", *ct)
    report = json.loads(r.stdout)
    assert report["phase"] == "dual_write" and report["phase_version"] == 4
    assert [(h["to"], h["action"], h["who"]) for h in report["history"]] == [
        ("planned", "start", "alice@h1"), ("dual_write", "advance", "bob@h2"), ("dual_read", "advance", "bob@h2"),
        ("dual_write", "rollback", "carol@h3")]
    assert [(s["instance"], s["phase_version"], s["live"], s["acknowledged"]) for s in report["shims"]] == [
        ("i-7", 3, True, False)]
    assert report["fleet"]["lagging"] == ["i-7 (app7 pid 70, on dual_read v3)"]


def test_two_advance_commands_racing_between_read_and_compare_and_set(setup, dynalite_server, monkeypatch,
                                                                     capsys):
    """Issue 27 point 8, forced: two `advance` commands (the real main(), one thread each) both
    read phase version 1, then meet at a barrier before their compare-and-set. Exactly one moves;
    the other is told who moved it from what to what, exit 2 (on dynalite: moto's conditional
    writes are not atomic across threads)."""
    from reshard.cli.main import main

    store, m, _ = setup
    store.register(m, who="alice@h0")
    barrier = threading.Barrier(2)
    real = ControlStore.set_phase

    def set_phase(self, *a, **kw):
        barrier.wait(60)
        return real(self, *a, **kw)

    monkeypatch.setattr(ControlStore, "set_phase", set_phase)
    results: dict = {}

    def go(name):
        results[name] = main(["--endpoint-url", dynalite_server.endpoint, "advance", m.id, "--allow-no-shims",
                              "--control-table", store.table])

    threads = [threading.Thread(target=go, args=(n,), name=n) for n in ("X", "Y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    out, err = capsys.readouterr()
    assert sorted(results.values()) == [0, 2], (out, err)
    (line,) = [l for l in err.splitlines() if l.startswith("reshard: error:")]
    g = LOSER.match(line)
    assert g and (g["acted_phase"], g["phase"], g["v"]) == ("planned", "dual_write", "2") and not g["after"], line
    hist = assert_history_consistent(store, m.id)
    assert [t.to_phase for t in hist] == ["planned", "dual_write"]
