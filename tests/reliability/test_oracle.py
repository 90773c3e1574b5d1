"""The chaos oracle's rules for late copies (tests/reliability/chaos.py ``Oracle.late_window``)
and the phases it treats as unfenced."""

from __future__ import annotations

from tests.reliability.chaos import ABSENT, Oracle, Write, unfenced


def _oracle(window: float, unfenced_first: bool) -> Oracle:
    o = Oracle(late_window=window)
    o.record(1, Write("a", "put", 0.0, 1.0, True, {"op": "a"}, unfenced=unfenced_first))
    o.record(1, Write("b", "put", 2.0, 3.0, True, {"op": "b"}))  # acknowledged, 1 s after "a" ended
    return o


def test_a_late_copy_of_an_unfenced_write_is_accepted_only_inside_the_window():
    # "a" showing at 10 s after "b" was acknowledged: its late copy landed over "b".
    assert _oracle(0.0, True).check(1, {"op": "a"}, 10.0, 10.1).startswith("stale")
    o = _oracle(5.0, True)
    assert o.check(1, {"op": "a"}, 10.0, 10.1) is None
    assert len(o.window_saves) == 1
    # "b" started 1 s after "a" ended: outside a 0.5 s window, "b" supersedes "a" again.
    assert _oracle(0.5, True).check(1, {"op": "a"}, 10.0, 10.1).startswith("stale")


def test_a_fenced_write_gets_no_window():
    # In a fenced phase its version refuses a late copy under "b": "a" is stale whatever the window.
    o = _oracle(5.0, False)
    assert o.check(1, {"op": "a"}, 10.0, 10.1).startswith("stale")
    assert o.check(1, {"op": "b"}, 10.0, 10.1) is None and o.window_saves == []


def test_a_late_put_after_an_unfenced_delete_is_no_resurrection_inside_the_window():
    for window, verdict in ((5.0, None), (0.0, "resurrected")):
        o = Oracle(late_window=window)
        o.record(1, Write("a", "put", 0.0, 1.0, True, {"op": "a"}, unfenced=True))
        o.record(1, Write(ABSENT, "delete", 2.0, 3.0, True, None, unfenced=True))
        got = o.check(1, {"op": "a"}, 10.0, 10.1)
        assert (got if got is None else got.split(":")[0]) == verdict, got


def test_unfenced_phases():
    assert [p for p in ("steady", "planned", "dual_write", "dual_read", "backfill", "cutover", "cleanup", "complete",
                        "aborted", "switching", "unknown") if unfenced(p)] == ["steady"]
