"""A stored ``_rs_v`` is input (issue 30, case 2): properties of the pure rules in
reshard.core.versions, for any value a plain client can store.

* a writer adopts (``VersionClock.observe``, ``stored_version``) only a well-formed string at
  most MAX_AHEAD_MS ahead of its clock; anything else raises BadVersion and the clock stays;
* versions a clock issues only grow, in string order, whatever it observed -- never a 14-digit
  millisecond count that would sort below every real version;
* a reader (``version_of``) never raises, whatever the attribute holds.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from reshard import errors
from reshard.core import versions as v

pytestmark = pytest.mark.unit

NOW = 1_790_000_000_000

#: Any attribute value DynamoDB can store, small.
scalars = st.one_of(
    st.builds(lambda s: {"S": s}, st.text(max_size=40)),
    st.builds(lambda n: {"N": str(n)}, st.integers(-10 ** 30, 10 ** 30)),
    st.builds(lambda b: {"B": b}, st.binary(max_size=8)),
    st.builds(lambda b: {"BOOL": b}, st.booleans()),
    st.just({"NULL": True}),
    st.builds(lambda xs: {"SS": xs}, st.lists(st.text(max_size=5), min_size=1, max_size=3, unique=True)),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.builds(lambda xs: {"L": xs}, st.lists(inner, max_size=3)),
    st.builds(lambda m: {"M": m}, st.dictionaries(st.text(max_size=4), inner, max_size=3))), max_leaves=6)
#: Strings shaped almost like versions (and some exactly).
version_like = st.builds(
    lambda ms, c, w, sep: f"{ms}{sep}{c:06d}{sep}{w}",
    st.one_of(st.integers(0, 10 ** 14), st.just(9_999_999_999_999), st.integers(NOW - 10 ** 6, NOW + 10 ** 7)),
    st.integers(0, 10 ** 7), st.text(min_size=0, max_size=70), st.sampled_from([".", ".", ".", ":"]))


@settings(max_examples=150, deadline=None)
@given(st.one_of(values, st.builds(lambda s: {"S": s}, version_like)))
def test_a_writer_adopts_a_stored_version_only_if_well_formed_and_not_too_far_ahead(av):
    item = {"_rs_v": av}
    assert isinstance(v.version_of(item), str)  # a reader never raises
    clock = v.VersionClock("me", now_ms=lambda: NOW)
    before = clock.next()
    try:
        got = v.stored_version(item, NOW, "item X")
    except errors.BadVersion as e:
        assert "item X" in str(e) and "\n" not in str(e)
        with pytest.raises(errors.BadVersion):
            clock.observe(av.get("S") or "x" if isinstance(av.get("S"), str) else "x")
        assert clock.next() > before  # the clock did not jump: still just above its own
        assert clock.next() < v.format_version(NOW + 1, 0, "me")
        return
    ms, counter, writer = v.parse_version(got)
    assert ms <= NOW + v.MAX_AHEAD_MS and len(got) <= 13 + 1 + 6 + 1 + v.MAX_WRITER_CHARS
    clock.observe(got)
    assert clock.next() > got  # adopted: the next version goes above it


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, v.MAX_AHEAD_MS), min_size=1, max_size=6), st.integers(0, 999_999))
def test_issued_versions_only_grow_in_string_order_also_across_a_full_counter(aheads, counter):
    clock = v.VersionClock("w1", now_ms=lambda: NOW)
    issued = [clock.next()]
    for ahead in aheads:
        seen = v.format_version(NOW + ahead, counter, "zz")
        clock.observe(seen)
        issued += [clock.next(), clock.next()]
        assert issued[-2] > seen
    assert issued == sorted(issued) and len(set(issued)) == len(issued)
    assert all(len(x.split(".")[0]) == 13 for x in issued)


def test_the_issues_forged_version_is_refused_and_the_clock_never_wraps():
    clock = v.VersionClock("me", now_ms=lambda: NOW)
    real = clock.next()
    with pytest.raises(errors.BadVersion, match="ahead of this writer's clock"):
        clock.observe("9999999999999.999999.zz")
    assert clock.next() > real
    # A clock that reached the last millisecond of the fixed width stops instead of issuing a
    # 14-digit version that sorts below every real one.
    edge = v.VersionClock("me", now_ms=lambda: 9_999_999_999_999)
    edge.observe("9999999999999.999999.zz")
    with pytest.raises(errors.BadVersion):
        edge.next()


@pytest.mark.parametrize("av, says", [
    ({"N": "1795000000000"}, "not a string"),
    ({"S": "1795000000000.000001"}, "not a version reshard writes"),
    ({"S": "1795000000000.000001.a.b"}, "not a version reshard writes"),
    ({"S": "1795000000000.000001." + "w" * 65}, "not a version reshard writes"),
    ({"S": "x" * 10_000}, "more characters"),
    ({"L": [{"S": "1795000000000.000001.a"}]}, "not a string"),
])
def test_each_bad_shape_is_named_in_one_line(av, says):
    with pytest.raises(errors.BadVersion) as e:
        v.stored_version({"_rs_v": av}, NOW, "item {'PK': 'a'}")
    assert says in str(e.value) and "item {'PK': 'a'}" in str(e.value) and len(str(e.value)) < 1000
    assert e.value.reason == "bad-version" and e.value.exit_code == 2
