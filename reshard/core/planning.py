"""Planning math for ``reshard plan``: what a migration will move, cost and need.

Pure domain module (stdlib + :mod:`reshard.core.layout`): no boto3, no I/O. The command
(:mod:`reshard.cli.plan`) scans a sample of the live table and feeds each item
to a :class:`SampleAnalysis`; everything here is arithmetic on what it saw, so the
tests drive it with literals.

Capacity model (DynamoDB's documented unit rules, applied per item):

* **Backfill** scans the whole table once, eventually consistent: 0.5 RCU per 4 KB
  read (a Scan rounds the *page* to 4 KB, not each item, so the model uses the
  total bytes). For every item that moves it then writes the new item with one
  version-conditioned PutItem (``ceil(new size / 1 KB)`` WCU). There is no read-back;
  only when an unversioned item's fence fails because another old item is already at
  its new key (a duplicate or a collision) does the copy read that key, consistently
  (``ceil(new size / 4 KB)`` RCU). A shim write already there fails the fence too; the
  plan cannot foresee those (live traffic), so they are not counted.
* **Cleanup** scans the table again -- by then it holds the old items *and* the new
  copies of the moved ones -- and retires each moved item with one UpdateItem that
  sets the TTL attribute (or one DeleteItem when there is no TTL attribute):
  ``ceil(size / 1 KB)`` WCU each (an UpdateItem is charged for the larger of the
  item before and after; the TTL attribute adds a few bytes, ignored here).
* Items that do not move are neither written nor retired. Unmappable items are
  scanned but never written.

Counts from a sample are scaled to the table's item count (DescribeTable's
``ItemCount``, which DynamoDB refreshes about every six hours).

On-demand prices are options of the command. The defaults are the us-east-1 list
prices for the Standard table class (USD 0.625 per million write request units and
USD 0.125 per million read request units, since the November 2024 price cut); other
regions, the Standard-IA class, reserved capacity and future price changes differ,
so the operator should check https://aws.amazon.com/dynamodb/pricing/on-demand/.
One read request unit buys what one RCU does (a consistent 4 KB read, or two
eventually consistent ones); one write request unit what one WCU does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from reshard.errors import UnmappableItem
from reshard.core.layout import KeyMapper, Layout, is_tombstone, item_size, scalar
from reshard.core.capacity import read_units, scan_units, write_units
from reshard.core.migration import JUMP, SHARD
from reshard.core.versions import version_of

#: USD per million on-demand write / read request units (us-east-1, Standard class).
DEFAULT_WRITE_PRICE = 0.625
DEFAULT_READ_PRICE = 0.125
#: Recommended shards = ceil(base x headroom): room for growth and uneven hashing.
DEFAULT_HEADROOM = 1.5
#: Default number of items ``plan`` samples (spread over the scan segments).
DEFAULT_SAMPLE = 2000
#: How many unmappable items the report shows as examples.
EXAMPLES = 5


# --------------------------------------------------------------------------- distribution

@dataclass(frozen=True)
class Distribution:
    """Items per shard of one layout, and how uneven that is."""

    counts: tuple[int, ...]

    @property
    def shards(self) -> int:
        return len(self.counts)

    @property
    def total(self) -> int:
        return sum(self.counts)

    @property
    def mean(self) -> float:
        return self.total / self.shards if self.shards else 0.0

    @property
    def max(self) -> int:
        return max(self.counts, default=0)

    @property
    def skew(self) -> float:
        """max / mean: 1.0 is perfectly even; 2.0 means the hottest shard gets twice its share."""
        return self.max / self.mean if self.mean else 0.0

    @property
    def hottest_shard(self) -> int | None:
        if not self.total:
            return None
        return self.counts.index(self.max)

    @property
    def hottest_pct(self) -> float:
        """The hottest shard's share of all items, in percent."""
        return 100.0 * self.max / self.total if self.total else 0.0

    @property
    def empty_shards(self) -> int:
        return sum(1 for c in self.counts if c == 0)

    def as_dict(self) -> dict:
        return {"shards": self.shards, "counts": list(self.counts), "total": self.total,
                "mean": round(self.mean, 3), "max": self.max, "skew": round(self.skew, 3),
                "hottest_shard": self.hottest_shard, "hottest_pct": round(self.hottest_pct, 2),
                "empty_shards": self.empty_shards}


def distribution(shard_of_each_item: Iterable[int], shards: int) -> Distribution:
    """Count items per shard (``0..shards-1``); a shard outside the range is a bug -> ValueError."""
    counts = [0] * shards
    for s in shard_of_each_item:
        if not 0 <= s < shards:
            raise ValueError(f"shard {s} outside 0..{shards - 1}")
        counts[s] += 1
    return Distribution(tuple(counts))


def histogram(dist: Distribution, width: int = 40, label: str = "shard") -> str:
    """A text histogram, one line per shard: ``  3 | ######        12  (6.2%)``.

    Bars are scaled to the largest shard; a non-empty shard always shows at least
    one mark so that "few" and "none" look different.
    """
    lines = []
    digits = len(str(max(dist.shards - 1, 0)))
    cwidth = len(str(dist.max))
    for i, c in enumerate(dist.counts):
        bar = "#" * (max(1, round(width * c / dist.max)) if c and dist.max else 0)
        pct = 100.0 * c / dist.total if dist.total else 0.0
        lines.append(f"  {label} {i:>{digits}} | {bar:<{width}} {c:>{cwidth}}  ({pct:4.1f}%)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- sample analysis

@dataclass
class SampleAnalysis:
    """What a sample of old-layout items says about a migration.

    Feed every scanned item to :meth:`observe`. ``plan`` is meant for before
    ``start``, but when it runs later the table also holds shim tombstones and copies
    in the new layout: those are counted apart (``tombstones``, ``in_new_layout``)
    rather than as unmappable. An item that fits neither layout is unmappable, with
    the reason from :class:`UnmappableItem` (of the old layout).
    """

    mapper: KeyMapper
    examples_limit: int = EXAMPLES
    full_scan: bool = False  # every item seen (a sample finds a collision only if it holds both items)
    scanned: int = 0
    tombstones: int = 0
    in_new_layout: int = 0
    mappable: int = 0
    moves: int = 0
    bytes_all: int = 0  # every scanned item, old size
    bytes_moved_old: int = 0
    bytes_moved_new: int = 0
    # The copy reads the new key (one consistent GetItem) only when an unversioned item's
    # version fence fails: another old copy of it (or another item's old key) is already there.
    fence_read_rcu: float = 0.0
    write_wcu: int = 0  # one write of each moved item in the new layout
    retire_wcu: int = 0  # one UpdateItem/DeleteItem of each moved old item
    unmappable: dict = field(default_factory=dict)  # reason -> count
    examples: list = field(default_factory=list)
    collisions: int = 0  # old items mapping to a new key another old item with other content holds
    collision_examples: list = field(default_factory=list)
    #: A combined migration's sharded GSIs: their :class:`~reshard.core.index_planning.IndexPlan`
    #: over the same sample (None: the file changes no index).
    index: Any = None
    # new key (digest) -> (identity, content digest, version, old key shown) of the newest item seen there
    _at_new_key: dict = field(default_factory=dict, repr=False)
    # old key (digest) -> (identity, old key shown)
    _old_keys: dict = field(default_factory=dict, repr=False)
    old_shards: list = field(default_factory=list)
    new_shards: list = field(default_factory=list)
    # Move counts of the alternatives ``plan`` compares (see MoveComparison); built on first use.
    alternatives: "MoveComparison | None" = None

    def observe(self, item: Mapping[str, Any]) -> None:
        """Account for one old-layout item (wire format)."""
        self.scanned += 1
        size = item_size(item)
        self.bytes_all += size
        if self.index is not None:
            self.index.observe(item)
        if is_tombstone(item):
            self.tombstones += 1
            return
        try:
            values = self.mapper.fields(item, self.mapper.old)
            old_shard = self.mapper.old.parse(item)[SHARD]
            new_shard = self.mapper.new.shard_for(values)
            new_item, moved = self.mapper.remap(item)
        except UnmappableItem as e:
            if self._fits_new(item):
                self.in_new_layout += 1
                return
            self.unmappable[e.reason] = self.unmappable.get(e.reason, 0) + 1
            if len(self.examples) < self.examples_limit:
                key = {a: _show(item[a]) for a in self.mapper.old.key_attrs if a in item}
                self.examples.append({"key": key, "reason": e.reason, "detail": e.detail})
            return
        self.mappable += 1
        taken = self._check_collision(item, new_item, values)
        self.old_shards.append(old_shard)
        self.new_shards.append(new_shard)
        if self.alternatives is None:
            self.alternatives = MoveComparison(self.mapper)
        self.alternatives.observe(item, values, moved)
        if moved:
            self.moves += 1
            new_size = item_size(new_item)
            self.bytes_moved_old += size
            self.bytes_moved_new += new_size
            if taken and not version_of(item):
                self.fence_read_rcu += read_units(item_size(new_item), consistent=True)
            self.write_wcu += write_units(new_size)
            self.retire_wcu += write_units(size)
            if self.index is not None:
                self.index.observe_copy(new_item)  # the new copy's put into each GSI it is in

    def _check_collision(self, item: Mapping[str, Any], new_item: Mapping[str, Any], values: Mapping) -> bool:
        """Old items that the new layout would put on one key: a *collision*.

        * two copies of one item (a random-suffix layout, where an application re-put it
          under a fresh suffix) with different content and no newer version between them
          (a newer version wins, as in the shim: not a collision);
        * two different items on one new key (two events of one sensor in one millisecond,
          where the new key drops what told them apart), whatever their versions;
        * an item whose new key is another item's old key: its copy would land on it.

        Only one of them can exist in the new layout, and which one is not ours to guess.
        Memory: a few digests per mappable item scanned (not the items). Returns whether an
        old item seen before already holds or maps to this item's new key (its copy's
        version fence would then fail).
        """
        old_key = {a: item[a] for a in self.mapper.old.key_attrs if a in item}
        new_key = {a: new_item[a] for a in self.mapper.new.key_attrs}
        ident = _digest({"identity": [str(v) for v in self.mapper.identity(values)]})
        slot, old_slot = _digest(new_key), _digest(old_key)
        content = _digest(self.mapper.content(item, self.mapper.old))
        version = version_of(item)
        shown = {a: _show(v) for a, v in old_key.items()}
        # An item whose new key is another item's old key (either one seen first).
        other = self._old_keys.get(slot)
        if slot != old_slot and other is not None and other[0] != ident:
            self._collide(new_key, other[1], shown, version)
        self._old_keys[old_slot] = (ident, shown)
        first = self._at_new_key.get(slot)
        if first is None:
            self._at_new_key[slot] = (ident, content, version, shown)
        else:
            first_ident, first_content, first_version, first_shown = first
            if version > first_version:
                self._at_new_key[slot] = (ident, content, version, shown)  # the newest wins
            if first_ident != ident or (content != first_content and version == first_version):
                self._collide(new_key, first_shown, shown, version)
        onto = self._at_new_key.get(old_slot)
        if onto is not None and onto[0] != ident and old_slot != slot:
            self._collide(old_key, onto[3], shown, version)
        return first is not None or (slot != old_slot and other is not None)

    def _collide(self, new_key: Mapping[str, Any], first: dict, second: dict, version: str) -> None:
        self.collisions += 1
        if len(self.collision_examples) < self.examples_limit:
            self.collision_examples.append({"new_key": {a: _show(v) for a, v in new_key.items()},
                                            "keys": [first, second], "version": version or None})

    def _fits_new(self, item: Mapping[str, Any]) -> bool:
        # Only this migration's marked copies that the new layout fully accounts for (key parses,
        # shard agrees). An unmarked item the old layout cannot map is unmappable even when its key
        # happens to fit the new layout (a [from] template that matches nothing, say): the backfill
        # would leave it behind.
        if not self.mapper.is_new_copy(item):
            return False
        try:
            self.mapper.fields(item, self.mapper.new)
        except UnmappableItem:
            return False
        return True

    @property
    def unmappable_count(self) -> int:
        return sum(self.unmappable.values())

    def old_distribution(self) -> Distribution:
        return distribution(self.old_shards, self.mapper.old.shards)

    def new_distribution(self) -> Distribution:
        return distribution(self.new_shards, self.mapper.new.shards)


# --------------------------------------------------------------------------- moves: hash vs jump

#: The scenarios compared per candidate [to] layout: this migration, then growing that
#: layout to twice its shards, then to half as many again (a growth that is not a doubling).
SCENARIOS = ("this_migration", "doubling", "growth")


def growth_shards(shards: int) -> tuple[int, int]:
    """The shard counts of the two follow-up growths ``plan`` prices: ``2M`` and ``M + ceil(M/2)``."""
    return 2 * shards, shards + max(1, -(-shards // 2))


class MoveComparison:
    """Sampled move counts for the file's [to] layout and for the same layout with ``hash = "jump"``.

    With ``hash % M`` a doubling keeps half the items, but any other growth moves most of
    them (32 -> 48 keeps a third); jump moves only ``1 - M/K`` for any growth M -> K. So
    the question ``plan`` answers is whether switching to jump now (which may move more
    items in *this* migration) pays back in the next growth. A following growth moves an
    item exactly when its shard changes (same templates, only the shard count differs).
    """

    def __init__(self, mapper: KeyMapper):
        self.mapper = mapper
        target = mapper.migration.target
        keys = mapper.keys
        jump_spec = dataclasses.replace(target, hash=JUMP, shard_function=None)
        self.target_is_jump = target.hash == JUMP
        self.specs = {"target": target, "jump": jump_spec}
        self.layouts: dict[str, tuple[Layout, ...]] = {}
        for name, spec in self.specs.items():
            self.layouts[name] = (Layout(spec, keys.partition, keys.sort),
                                  *(Layout(dataclasses.replace(spec, shards=n), keys.partition, keys.sort)
                                    for n in growth_shards(spec.shards)))
        self.counts = {name: [0, 0, 0] for name in self.specs}
        self.observed = 0

    def observe(self, item: Mapping[str, Any], values: Mapping[str, Any], moved: bool) -> None:
        """Count one mappable old item (``values`` its key fields; ``moved`` in this migration)."""
        self.observed += 1
        for name, (layout, doubled, grown) in self.layouts.items():
            c = self.counts[name]
            if name == "target" or self.target_is_jump:
                c[0] += moved
            else:
                c[0] += any(item.get(a) != v for a, v in layout.key(values).items())
            shard = layout.shard_for(values)
            c[1] += doubled.shard_for(values) != shard
            c[2] += grown.shard_for(values) != shard

    def fraction(self, name: str, scenario: str) -> float:
        return self.counts[name][SCENARIOS.index(scenario)] / self.observed if self.observed else 0.0

    def as_dict(self, scale: float) -> dict:
        """The ``moves`` block of ``plan --json``: per layout and scenario, sampled items, fraction, estimate."""
        layouts = {}
        for name, spec in self.specs.items():
            row = {"hash": spec.hash, "shard_function": spec.shard_function, "shards": spec.shards}
            for i, scenario in enumerate(SCENARIOS):
                n = self.counts[name][i]
                to = spec.shards if i == 0 else growth_shards(spec.shards)[i - 1]
                row[scenario] = {"to_shards": to, "sampled_items": n,
                                 "fraction": round(self.fraction(name, scenario), 4),
                                 "estimated_items": round(n * scale)}
            layouts[name] = row
        recommend, advice = self.advice()
        return {"sampled": self.observed, "layouts": layouts, "recommend_jump": recommend, "advice": advice}

    def advice(self) -> tuple[bool | None, str]:
        """Whether to use jump in [to] (None when it already does), and one line saying why.

        Jump pays when the items it adds to this migration are fewer than those it saves
        in the next growth that is not a doubling (a doubling costs both half the items).
        """
        m = self.specs["target"].shards
        _, grow = growth_shards(m)
        pct = lambda name, sc: f"{100 * self.fraction(name, sc):.1f}%"  # noqa: E731
        if not self.observed:
            return None, "no mappable item sampled: nothing to compare"
        if self.target_is_jump:
            return None, (f'[to] uses hash = "jump": a later growth {m} -> K shards moves only 1 - {m}/K '
                          f"of the items ({m} -> {grow}: {pct('jump', 'growth')})")
        now = self.fraction("jump", "this_migration") - self.fraction("target", "this_migration")
        later = self.fraction("target", "growth") - self.fraction("jump", "growth")
        what = self.specs["target"].hash or "shard_function"
        compare = (f"jump moves {pct('jump', 'this_migration')} now (vs {pct('target', 'this_migration')}) "
                   f"and {pct('jump', 'growth')} in a later {m} -> {grow} (vs {pct('target', 'growth')})")
        if now <= later:
            return True, f'recommended: hash = "jump" in [to]: {compare}'
        return False, (f"jump not recommended for this migration (keep {what}): {compare}; "
                       "it pays back only over later growths that are not doublings")


def _digest(wire: Mapping[str, Any]) -> bytes:
    text = json.dumps(wire, sort_keys=True, default=lambda b: b.hex() if isinstance(b, bytes) else str(b))
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def _show(av: Mapping[str, Any]) -> Any:
    v = scalar(av)
    if isinstance(v, bytes):
        return v.hex()
    return str(v) if v is not None else av


# --------------------------------------------------------------------------- capacity and cost

@dataclass(frozen=True)
class Capacity:
    """Capacity units a job consumes in total (not per second)."""

    scan_rcu: float
    fence_read_rcu: float  # consistent reads of a new key after a failed copy fence (duplicates, collisions)
    wcu: float

    @property
    def rcu(self) -> float:
        return self.scan_rcu + self.fence_read_rcu

    def as_dict(self) -> dict:
        return {"scan_rcu": round(self.scan_rcu, 1), "fence_read_rcu": round(self.fence_read_rcu, 1),
                "rcu": round(self.rcu, 1), "wcu": round(self.wcu, 1)}


@dataclass(frozen=True)
class Estimate:
    """Capacity, time and on-demand cost of the backfill and the cleanup for a whole table."""

    scale: float  # table items / sampled items
    backfill: Capacity
    cleanup: Capacity
    max_wcu: float | None
    write_price: float
    read_price: float

    @property
    def backfill_seconds(self) -> float | None:
        """Seconds the backfill's writes take at ``max_wcu`` WCU/s (the write budget binds)."""
        return self.backfill.wcu / self.max_wcu if self.max_wcu else None

    @property
    def cleanup_seconds(self) -> float | None:
        return self.cleanup.wcu / self.max_wcu if self.max_wcu else None

    def cost(self, c: Capacity) -> float:
        """USD at on-demand prices (1 RRU = 1 RCU, 1 WRU = 1 WCU)."""
        return c.rcu / 1e6 * self.read_price + c.wcu / 1e6 * self.write_price

    def as_dict(self) -> dict:
        return {
            "scale": round(self.scale, 6),
            "backfill": self.backfill.as_dict(),
            "cleanup": self.cleanup.as_dict(),
            "max_wcu": self.max_wcu,
            "backfill_seconds": _round(self.backfill_seconds),
            "cleanup_seconds": _round(self.cleanup_seconds),
            "on_demand": {
                "write_price_per_million": self.write_price,
                "read_price_per_million": self.read_price,
                "backfill_usd": round(self.cost(self.backfill), 4),
                "cleanup_usd": round(self.cost(self.cleanup), 4),
                "total_usd": round(self.cost(self.backfill) + self.cost(self.cleanup), 4),
            },
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def estimate(sample: SampleAnalysis, table_items: int, *, max_wcu: float | None = None,
             write_price: float = DEFAULT_WRITE_PRICE, read_price: float = DEFAULT_READ_PRICE) -> Estimate:
    """Scale a sample's per-item units to ``table_items`` items.

    ``table_items`` is at least the sample size (DescribeTable's ItemCount lags).
    """
    total = max(table_items, sample.scanned)
    scale = total / sample.scanned if sample.scanned else 0.0
    backfill = Capacity(scan_rcu=scan_units(round(sample.bytes_all * scale)),
                        fence_read_rcu=sample.fence_read_rcu * scale,
                        wcu=sample.write_wcu * scale)
    # The cleanup scan sees the old items plus the new copies of the moved ones.
    cleanup = Capacity(scan_rcu=scan_units(round((sample.bytes_all + sample.bytes_moved_new) * scale)),
                       fence_read_rcu=0.0,
                       wcu=sample.retire_wcu * scale)
    return Estimate(scale, backfill, cleanup, max_wcu, write_price, read_price)


# --------------------------------------------------------------------------- shard count

@dataclass(frozen=True)
class Recommendation:
    """Shards needed for a hot entity's peak write rate (the AWS write-sharding formula)."""

    peak_writes_per_sec: float
    item_kb: float
    headroom: float
    base: int  # ceil(writes x ceil(KB) / 1000): one partition takes 1,000 WCU/s
    shards: int  # ceil(base x headroom)
    target_shards: int

    @property
    def warning(self) -> str | None:
        if self.target_shards >= self.shards:
            return None
        return (f"[to] shards = {self.target_shards} is below the recommended {self.shards} "
                f"for {self.peak_writes_per_sec:g} writes/s of {self.item_kb:g} KB items "
                f"({self.base} partitions at 1,000 WCU/s, x{self.headroom:g} headroom)")

    def as_dict(self) -> dict:
        return {"peak_writes_per_sec": self.peak_writes_per_sec, "item_kb": self.item_kb,
                "headroom": self.headroom, "base_shards": self.base, "recommended_shards": self.shards,
                "to_shards": self.target_shards, "warning": self.warning}


def recommend(peak_writes_per_sec: float, item_kb: float, target_shards: int,
              headroom: float = DEFAULT_HEADROOM) -> Recommendation:
    """``ceil(writes x ceil(KB) / 1000)`` shards per hot entity, times ``headroom``.

    A partition serves at most 1,000 WCU/s and a write costs ``ceil(KB)`` WCU, so the
    base is the fewest shards that can absorb the peak; the headroom covers growth and
    the unevenness of hashing a modest number of keys.
    """
    if peak_writes_per_sec <= 0 or item_kb <= 0 or headroom < 1:
        raise ValueError("peak writes and item size must be positive, headroom at least 1")
    base = max(1, math.ceil(peak_writes_per_sec * math.ceil(item_kb) / 1000))
    shards = max(1, math.ceil(round(base * headroom, 9)))
    return Recommendation(peak_writes_per_sec, item_kb, headroom, base, shards, target_shards)


def human_seconds(seconds: float | None) -> str:
    """``3725`` -> ``1h 2m 5s``."""
    if seconds is None:
        return "-"
    s = int(math.ceil(seconds))
    if s < 60:
        return f"{s}s"
    parts = []
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            parts.append(f"{s // n}{unit}")
            s %= n
    if s:
        parts.append(f"{s}s")
    return " ".join(parts)


def sample_quota(sample: int, segments: int) -> Sequence[int]:
    """Items to take from each scan segment so that ``sample`` are spread over all of them."""
    base, extra = divmod(sample, segments)
    return [base + (1 if i < extra else 0) for i in range(segments)]


# --------------------------------------------------------------------------- what start refuses

def blockers(a: SampleAnalysis, allow_unmappable: int = 0) -> list[str]:
    """Why ``start`` refuses this migration, one sentence per problem (empty: it may start).

    ``plan`` shows the same list, so what ``plan`` flags is exactly what ``start`` refuses.
    The sample's counts are a lower bound of the table's: an allowance smaller than what
    the sample already found cannot cover the table; the backfill and verify hold the
    whole table to the same allowance later.
    """
    out = []
    live = a.scanned - a.tombstones - a.in_new_layout
    shown = _example_text(a.examples[0]) if a.examples else ""
    if live and not a.mappable and a.unmappable_count:
        # A template that matches nothing: no allowance makes that a migration.
        out.append(f"no sampled item fits the [from] layout ({a.unmappable_count} of {live} unmappable, e.g. "
                   f"{shown}): fix the [from] templates (plan shows examples)")
        return out
    too_large = a.unmappable.get("too-large", 0)
    if too_large:
        # Size growth: the longer key and the marker push an item over the limit. Verify fails on
        # such an item whatever the allowance (its new copy cannot exist), so it blocks cutover.
        ex = next((e for e in a.examples if e["reason"] == "too-large"), None)
        out.append(f"{too_large} sampled item(s) would exceed DynamoDB's 400 KB item limit after re-keying"
                   + (f" (e.g. {_example_text(ex)})" if ex else "") + ": they would block cutover; shrink or "
                   "delete them first")
    other = a.unmappable_count - too_large
    if other > allow_unmappable:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(a.unmappable.items()) if k != "too-large")
        ex = next((e for e in a.examples if e["reason"] != "too-large"), None)
        out.append(f"{other} sampled item(s) cannot be mapped ({reasons}"
                   + (f"; e.g. {_example_text(ex)}" if ex else "") + f") and the allowance is {allow_unmappable}: "
                   f"fix them, or allow them explicitly with --allow-unmappable N (N at least {other}; the backfill "
                   "skips and lists them)")
    if a.collisions:
        ex = a.collision_examples[0] if a.collision_examples else None
        eg = ""
        if ex:
            keys = " and ".join(_key_text(k) for k in ex["keys"])
            eg = f" (e.g. {keys} -> {_key_text(ex['new_key'])})"
        out.append(f"{a.collisions} sampled old item(s) map to the same new key as another old item{eg}: only one "
                   "can exist in the new layout; keep them apart in [to] (add the field that tells them apart) or "
                   "resolve each pair before start")
    return out


def _key_text(key: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in key.items())


def _example_text(ex: Mapping[str, Any]) -> str:
    return f"{_key_text(ex['key'])}: {ex['detail']}"
