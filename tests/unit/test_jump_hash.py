"""``hash = "jump"``: bit-exact with published vectors, uniform, and minimal movement.

Vectors:
* Guava, ``HashingTest.testConsistentHash_linearCongruentialGeneratorCompatibility``
  (``Hashing.consistentHash(long, int)``, Lamping & Veach's LCG and division).
* The Go ``jump`` package's tests (``jump.Hash(key, buckets)``, as in dgryski/go-jump).
"""

from __future__ import annotations

import hashlib
import math

import pytest
from hypothesis import given, settings, strategies as st

from reshard.core import migration
from reshard.core.layout import KeyMapper, hash_shard, jump_hash, jump_key

GUAVA_GOLDEN_100 = [0, 55, 62, 8, 45, 59, 86, 97, 82, 59, 73, 37, 17, 56, 86, 21, 90, 37, 38, 83]
GUAVA = [(10863919174838991, 11, 6), (2016238256797177309, 11, 3), (1673758223894951030, 11, 5),
         (2, 100001, 80343), (2201, 100001, 22152), (2202, 100001, 15018)]
GO = [(1, 1, 0), (42, 57, 43), (0xDEAD10CC, 1, 0), (0xDEAD10CC, 666, 361), (256, 1024, 520)]

u64 = st.integers(0, 2**64 - 1)


# The chi-square bound without scipy (no extra dependency for one quantile): for an integer
# number of degrees of freedom k the survival function is a finite sum (Abramowitz & Stegun
# 26.4.4 / 26.4.5), evaluated term by term in logs so that k = 999 does not overflow; the
# quantile is its inverse by bisection (the function falls monotonically in x).
def chi2_sf(x: float, k: int) -> float:
    """P(X > x) for X ~ chi-square with k degrees of freedom (k a positive integer)."""
    if x <= 0:
        return 1.0
    h = x / 2
    if k % 2 == 0:
        return sum(math.exp(j * math.log(h) - h - math.lgamma(j + 1)) for j in range(k // 2))
    return math.erfc(math.sqrt(h)) + sum(math.exp((j + 0.5) * math.log(h) - h - math.lgamma(j + 1.5))
                                         for j in range((k - 1) // 2))


def chi2_upper_quantile(p: float, k: int) -> float:
    """The x with P(X > x) = p (scipy's ``chi2.ppf(1 - p, k)``)."""
    lo, hi = 0.0, k + 20.0 * math.sqrt(2 * k) + 100.0
    assert chi2_sf(hi, k) < p
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, k) > p else (lo, mid)
    return (lo + hi) / 2


@pytest.mark.parametrize("k,quantile,sf_at_50", [
    # scipy 1.17's chi2.ppf(1 - 1e-6, k) and chi2.sf(50, k), for these degrees of freedom
    (1, 23.92812697687947, 1.537459794428033e-12), (2, 27.631021115871036, 1.3887943864964e-11),
    (6, 38.25833637714585, 4.701068998290324e-09), (31, 83.64251584691797, 0.016757268937175076),
    (99, 180.79201532577878, 0.9999900545468124), (999, 1226.0461890118645, 1.0)])
def test_the_chi_square_bound_is_scipys(k, quantile, sf_at_50):
    assert chi2_upper_quantile(1e-6, k) == pytest.approx(quantile, rel=1e-9)
    assert chi2_sf(50.0, k) == pytest.approx(sf_at_50, rel=1e-9, abs=1e-15)
    assert chi2_sf(7.0, 2) == pytest.approx(math.exp(-3.5), rel=1e-12)  # k = 2: exp(-x/2) exactly


def test_published_vectors():
    assert [jump_hash(k, 100) for k in range(20)] == GUAVA_GOLDEN_100
    for key, buckets, expected in GUAVA + GO:
        assert jump_hash(key, buckets) == expected, (key, buckets)


def test_java_negative_longs_are_the_same_64_bits():
    # Guava takes a signed long; the algorithm works on its 64 bits. -1 is 2**64 - 1.
    assert jump_hash(-1, 1000) == jump_hash(2**64 - 1, 1000)


def test_key_derivation_is_the_documented_one():
    s = "sensor-7#evt-00042"
    assert jump_key(s) == int(hashlib.sha256(s.encode()).hexdigest()[:16], 16)
    assert hash_shard(s, 32, "jump") == jump_hash(jump_key(s), 32)
    with pytest.raises(ValueError):
        jump_hash(1, 0)


@pytest.mark.parametrize("buckets", [7, 32, 100, 1000])
def test_uniform_chi_square(buckets):
    # Fixed inputs, so the statistic is one number per bucket count: it cannot flake.
    # The bound is the chi-square quantile at p = 1e-6: a biased jump (e.g. an LCG step
    # or a division that is off) lands far above it.
    n = 50 * buckets
    counts = [0] * buckets
    for i in range(n):
        counts[jump_hash(jump_key(f"item-{i}"), buckets)] += 1
    expected = n / buckets
    stat = sum((c - expected) ** 2 / expected for c in counts)
    assert stat < chi2_upper_quantile(1e-6, buckets - 1), (buckets, stat)


def test_chi_square_detects_a_biased_hash():
    # The check above can fail: "% buckets" over a key skewed to low values does.
    buckets, n = 32, 1600
    counts = [0] * buckets
    for i in range(n):
        counts[min(jump_hash(jump_key(f"item-{i}"), buckets), jump_hash(jump_key(f"x-{i}"), buckets))] += 1
    stat = sum((c - n / buckets) ** 2 / (n / buckets) for c in counts)
    assert stat > chi2_upper_quantile(1e-6, buckets - 1)


@settings(max_examples=300, deadline=None)
@given(u64, st.integers(1, 1000), st.integers(1, 1000))
def test_growing_never_moves_between_old_buckets(key, n, m):
    n, m = min(n, m), max(n, m)
    old, new = jump_hash(key, n), jump_hash(key, m)
    assert 0 <= old < n and 0 <= new < m
    assert new == old or new >= n


@settings(max_examples=100, deadline=None)
@given(u64, st.integers(1, 200))
def test_one_more_bucket_takes_only_for_itself(key, n):
    # The paper's definition: ch(k, n+1) is ch(k, n) or the new bucket n.
    assert jump_hash(key, n + 1) in (jump_hash(key, n), n)


JUMP_TO_JUMP = """\
id = "j"
table = "Things"
[keys]
partition = "PK"
sort = "SK"
[from]
partition = "{tenant}#{shard}"
sort = "{name}"
shards = {n}
shard_by = ["tenant", "name"]
hash = "jump"
[to]
partition = "{tenant}#{shard}"
sort = "{name}"
shards = {m}
shard_by = ["tenant", "name"]
hash = "jump"
"""


@settings(max_examples=150, deadline=None)
@given(st.text(st.characters(blacklist_characters="#", blacklist_categories=("Cs",)), min_size=1, max_size=12),
       st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12),
       st.integers(1, 300), st.integers(1, 300))
def test_migration_moves_exactly_the_items_whose_bucket_changes(tenant, name, n, m):
    if n == m:
        m = n + 1
    mapper = KeyMapper(migration.parse(JUMP_TO_JUMP.replace("{n}", str(n)).replace("{m}", str(m)), "j.toml"))
    old_shard = jump_hash(jump_key(f"{tenant}#{name}"), n)  # the documented key: shard_by joined with '#'
    item = {"PK": {"S": f"{tenant}#{old_shard}"}, "SK": {"S": name}, "v": {"N": "1"}}
    new_shard = jump_hash(jump_key(f"{tenant}#{name}"), m)
    new_item, moved = mapper.remap(item)
    assert moved == mapper.moves(item) == (new_shard != old_shard)
    assert new_item["PK"] == {"S": f"{tenant}#{new_shard}"} and new_item["SK"] == {"S": name}
    if m > n and moved:
        assert new_shard >= n


def test_jump_is_allowed_on_both_sides_and_random_stays_refused_in_to():
    m = migration.parse(JUMP_TO_JUMP.replace("{n}", "4").replace("{m}", "8"), "j.toml")
    assert (m.source.hash, m.target.hash) == ("jump", "jump")
    mixed = JUMP_TO_JUMP.replace("{n}", "4").replace("{m}", "4").replace('hash = "jump"', 'hash = "sha256"', 1)
    assert migration.parse(mixed, "j.toml").source.hash == "sha256"
    random_to = JUMP_TO_JUMP.replace("{n}", "4").replace("{m}", "8")
    head, tail = random_to.split("[to]")
    with pytest.raises(migration.MigrationFileError, match="random"):
        migration.parse(head + "[to]" + tail.replace('shard_by = ["tenant", "name"]\nhash = "jump"',
                                                     'shard_by = "random"'), "j.toml")


def test_the_readme_snippet_is_the_implementation():
    import pathlib
    import re
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = re.search(r"```python\n(\s*def jump_hash.*?)```", readme, re.S).group(1)
    ns: dict = {}
    exec(compile("\n".join(line[2:] for line in code.splitlines()), "README", "exec"), ns)  # noqa: S102
    for key, buckets, expected in GUAVA + GO:
        assert ns["jump_hash"](key, buckets) == expected
    for i in range(200):
        k = jump_key(f"k{i}")
        assert ns["jump_hash"](k, 1 + i * 5) == jump_hash(k, 1 + i * 5)
