"""``--processes``: how many, each one's budget share, the header, and what the parent reports
when children fail (no process is started here: tests/integration/test_processes.py does)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from reshard.cli.main import main
from reshard.cli.options import resolve_processes
from reshard.jobs import processes
from reshard.jobs.processes import ProcessFailed, _Child, verdict
from reshard.jobs.runner import JobOptions
from reshard.jobs.subscribers import ProgressReporter


def test_the_default_is_the_cores_and_never_more_processes_than_segments(monkeypatch):
    monkeypatch.setattr(processes.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert resolve_processes(None, 16) == 8
    assert resolve_processes(None, 3) == 3
    assert resolve_processes(2, 16) == 2 and resolve_processes(32, 4) == 4
    monkeypatch.delattr(processes.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(processes.os, "cpu_count", lambda: None)
    assert resolve_processes(None, 16) == 1


def test_the_header_names_processes_and_workers():
    said: list[str] = []
    rep = ProgressReporter("backfill", "m1", 16, 4, total=lambda: (None, ""), say=said.append, processes=3)
    rep.on_run_start(SimpleNamespace(run=2))
    assert said == ["backfill of m1: 16 segments, 3 processes × 4 workers on this host (run 2)"]


def _child(index: int, exitcode: int | None, outcome: tuple | None) -> _Child:
    return _Child(index, SimpleNamespace(exitcode=exitcode, pid=1000 + index), None, outcome)


def _combine_only(children, stopped=False):
    return verdict(children, stopped, "backfill", "m1")


def test_a_killed_child_is_one_line_naming_it_and_exit_1():
    ok = ("result", {"worked": [0], "consumed": {}, "last_throttle": "", "stopped": False, "stop_reason": "",
                     "pid": 1001, "cpu_seconds": 0.1, "maxrss_kb": 1})
    with pytest.raises(ProcessFailed) as e:
        _combine_only([_child(0, -9, None), _child(1, 0, ok)])
    assert e.value.exit_code == 1 and "\n" not in str(e.value)
    assert str(e.value).startswith("backfill process 1 of 2 (pid 1000) died (killed by SIGKILL)")


def test_the_exit_status_is_the_worst_childs_and_the_message_is_its_own():
    with pytest.raises(ProcessFailed) as e:
        _combine_only([_child(0, -9, None), _child(1, 0, ("error", 2, "backfill run 1 was started with --segments 8"))])
    assert e.value.exit_code == 2
    assert str(e.value) == "backfill run 1 was started with --segments 8 (and 1 other process failure(s))"
    with pytest.raises(ProcessFailed) as e:  # the same refusal from every child: said once
        _combine_only([_child(i, 0, ("error", 2, "refused")) for i in range(3)])
    assert (e.value.exit_code, str(e.value)) == (2, "refused")


def test_an_interrupted_child_failed_unless_the_parent_was_stopped():
    ok = ("result", {"worked": [], "stopped": True})
    with pytest.raises(ProcessFailed) as e:
        _combine_only([_child(0, 0, ("error", 130, "interrupted")), _child(1, 0, ok)])
    assert e.value.exit_code == 130
    assert _combine_only([_child(0, 0, ("error", 130, "interrupted")), _child(1, 0, ok)], stopped=True) == [ok[1]]


def test_verify_no_record_runs_in_one_process(capsys):
    code = main(["verify", "m1", "--no-record", "--processes", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("reshard: error: --no-record scans in this process") and err.count("\n") == 1
