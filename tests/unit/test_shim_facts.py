"""Issue 25, shim side, pure parts: the catch-up routing, the retry condition and own-attempt
recognition, and the shim's fact keeping (``shim.phase_cache.Facts``, ``PhaseCache.horizon``)."""

from __future__ import annotations

import pytest

from reshard import errors
from reshard.core.deadlines import SEND_MARGIN_SECONDS
from reshard.core.phases import ROUTING, SWITCH, Phase, routing_of
from reshard.core import versions
from reshard.core.phases import STEADY
from reshard.core.versions import own_attempt
from reshard.shim.phase_cache import Facts, PhaseCache, PhaseState


class Clock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


# ------------------------------------------------------------------ routing_of
def test_routing_without_a_flag_is_the_phase_table():
    for p in Phase:
        assert routing_of(p) is ROUTING[p]
        assert routing_of(p, False, None) is ROUTING[p]
        assert routing_of(p, True, "old") is SWITCH


@pytest.mark.parametrize("phase,flag", [(Phase.CUTOVER, "old"), (Phase.BACKFILL, "new"), (Phase.DUAL_READ, "new"),
                                        (Phase.DUAL_WRITE, "new"), (Phase.CLEANUP, "old")])
def test_catch_up_reads_both_layouts_and_names_the_flagged_one(phase, flag):
    r = routing_of(phase, False, flag)
    base = ROUTING[phase]
    assert r.catch_up == flag
    assert set(r.reads) == {"old", "new"} and r.reads[0] == base.reads[0]
    assert (r.writes, r.tombstones, r.fenced, r.hold) == (base.writes, base.tombstones, base.fenced, base.hold)


@pytest.mark.parametrize("phase,flag", [(Phase.CUTOVER, "new"), (Phase.BACKFILL, "old"), (Phase.COMPLETE, "new"),
                                        (Phase.BACKFILL, "bogus")])
def test_a_flag_naming_the_authoritative_layout_changes_nothing(phase, flag):
    assert routing_of(phase, False, flag) is ROUTING[phase]


# ------------------------------------------------------------------ versions
def test_every_migration_phase_is_fenced_with_tombstones_and_own_attempt_needs_equal_versions():
    # Issue 25: a duplicate or held first attempt lands until its horizon in every phase, so
    # every phase of a registered migration fences (`_rs_v < :v`) and deletes with a tombstone;
    # `_rs_v <> :v` (which recognised only our own landed attempt) is gone. Steady: boto3's.
    for p in Phase:
        assert ROUTING[p].fenced and ROUTING[p].tombstones, p
    assert not STEADY.fenced and not STEADY.tombstones
    assert not hasattr(versions, "not_version")
    assert own_attempt("1.2.w", {"_rs_v": {"S": "1.2.w"}})
    assert not own_attempt("1.2.w", {"_rs_v": {"S": "1.3.w"}})
    assert not own_attempt("1.2.w", None) and not own_attempt(None, {"_rs_v": {"S": ""}})
    assert not own_attempt("", {})


# ------------------------------------------------------------------ Facts
def test_facts_keep_the_latest_fact_per_version_and_estimate_the_server_clock():
    clock = Clock()
    f = Facts(clock)
    assert not f.dated and f.server_now() is None and f.horizon(1) is None
    f.note_answer(5000.0)
    f.saw(1, 5000.0, 15.0)
    assert f.dated and f.horizon(1) == 5015.0 and f.fact_date(1) == 5000.0
    clock.t += 3
    assert f.server_now() == 5003.0
    f.saw(1, 4990.0, 15.0)  # an older fact never replaces a newer one
    assert f.horizon(1) == 5015.0
    f.saw(2, 5002.0, 15.0)
    assert f.horizon(2) == 5017.0 and f.horizon_seconds == 15.0
    # The latest answer anchors the estimate.
    f.note_answer(5010.0)
    assert f.server_now() == 5010.0
    clock.t += 2
    assert f.server_now() == 5012.0
    f.forget_before(2)
    assert f.horizon(1) is None and f.horizon(2) == 5017.0


def test_a_fact_is_usable_until_the_send_margin_before_its_horizon():
    clock = Clock()
    f = Facts(clock)
    f.note_answer(5000.0)
    f.saw(1, 5000.0, 15.0)
    clock.t += 15 - SEND_MARGIN_SECONDS - 0.01
    assert f.usable(1)
    clock.t += 0.02
    assert not f.usable(1)
    assert not f.usable(7)  # no fact saw version 7


# ------------------------------------------------------------------ PhaseCache.horizon
class _Cache(PhaseCache):
    """A PhaseCache whose refresh is scripted: ``facts_on_refresh`` (version, date) or a failure."""

    def __init__(self, clock):
        from tests.shim_helpers import migration
        super().__init__(migration("sensor"), dynamo=_NoDynamo(), control_table=None, instance_id="i",
                         refresh_seconds=5, liveness_seconds=30, clock=clock)
        self._control = object()  # "controlled": horizons apply
        self.refreshes = 0
        self.next_fact: tuple[int, float] | None = None

    def _refresh_locked(self) -> bool:
        self.refreshes += 1
        if self.next_fact is None:
            self._last_error = "control table unreachable"
            return False
        version, date = self.next_fact
        self.facts.note_answer(date)
        self.facts.saw(version, date, 15.0)
        self._state = PhaseState("backfill", version, ROUTING[Phase.BACKFILL])
        return True


class _NoDynamo:
    attempt_seconds = 35.0
    max_request_seconds = 60.0


def test_horizon_signs_from_the_fact_and_refreshes_or_fails_closed():
    clock = Clock()
    c = _Cache(clock)
    st = PhaseState("backfill", 3, ROUTING[Phase.BACKFILL])
    assert c.horizon(st) is None  # the server never dated an answer: nothing to sign by
    c.facts.note_answer(5000.0)
    c.facts.saw(3, 5000.0, 15.0)
    assert c.horizon(st) == 5015.0 and c.refreshes == 0
    # Close to the horizon: refresh first; a refresh that sees the same version renews the fact.
    clock.t += 14.5
    c.next_fact = (3, 5014.0)
    assert c.horizon(st) == 5029.0 and c.refreshes == 1
    # The refresh fails: fail closed, nothing is sent.
    clock.t += 14.5
    c.next_fact = None
    with pytest.raises(errors.ShimUnavailable, match="no usable fact for phase version 3.*refresh failed"):
        c.horizon(st)
    # The phase moved on: a request under the old version has no fact to obey any more.
    c.next_fact = (4, 5029.0)
    with pytest.raises(errors.ShimUnavailable, match="phase moved on to version 4"):
        c.horizon(st)
    assert c.horizon(PhaseState("backfill", 4, ROUTING[Phase.BACKFILL])) == 5044.0


def test_a_pinned_cache_signs_nothing():
    c = _Cache(Clock())
    c.facts.note_answer(5000.0)
    c.pin("cutover")
    assert c.horizon(c.current()) is None


def test_a_switch_holds_requests_as_long_as_it_lasts():
    """With a server deadline a switch lasts H + 2 s of server time before the fleet may act on
    the new authority: a held request waits that long too (plus the fleet's acknowledgement),
    rather than fail with SwitchInProgress in every switch."""
    c = _Cache(Clock())
    assert c.switch_hold_seconds == 5 * 1.2 + 2.0  # no server deadline (test servers): as before
    c._enforced = True
    c.facts.saw(1, 5000.0, 6.0)
    assert c.switch_hold_seconds == 5 * 1.2 + 2.0 + 6.0 + 2.0
    c._switch_hold = 1.5  # given explicitly: as given
    assert c.switch_hold_seconds == 1.5
