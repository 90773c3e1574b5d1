"""Whole migrations under chaos (dynalite --path, a faulty proxy, killed backfills, rollbacks).

Reproduce a failure with its seed: ``RESHARD_CHAOS_SEED=<printed seed> python3 -m pytest
tests/reliability/test_chaos_lifecycle.py -s``. The hourly lifecycle (in CI) runs on every
behaviour of the fidelity proxy with issue 25's late faults and the server deadline enforced,
and freezes a shim process across cleanup, complete and ``--strip-bookkeeping``; the soak
(every lifecycle so, one seed a run) is in tests/reliability/lifecycle.py's docstring and the
README's tests section.
"""

from __future__ import annotations

import json
import os


from reshard.control.runs import allowed_unmappable, unmappable_items
from reshard.core.phases import Action

from tests.reliability.lifecycle import EVERY_BEHAVIOUR, Lifecycle

SEED = int(os.environ.get("RESHARD_CHAOS_SEED", "8082026"))
def verify(lc: Lifecycle) -> None:
    """`reshard verify` through the faulty proxy, while the application writes: must pass (after
    ``verify --repair`` of mirrors the shims lost past their horizon, under the late faults)."""
    lc.verify_repairing_lost_mirrors("--segments", "8")


def cleanup(lc: Lifecycle) -> bool:
    """`reshard cleanup`: on the proxy's TTL, `--enable-ttl`, then TTL time moved past
    `retain_hours` so the proxy deletes the old copies late, as DynamoDB does; without it,
    `--delete` (dynalite has no TTL). True when it ran."""
    if not lc.fidelity.get("ttl"):
        r = lc.cli("--output", "json", "cleanup", lc.m.id, "--segments", "8", "--delete", timeout=180)
        assert r.returncode == 0, r.stderr
        return True
    r = lc.cli("--output", "json", "cleanup", lc.m.id, "--segments", "8", "--enable-ttl", timeout=180)
    assert r.returncode == 0, r.stderr
    expiring = json.loads(r.stdout)
    lc.log(f"cleanup marked old copies to expire: {expiring.get('expiring', expiring)}")
    lc.proxy.configure(ttl_time_offset=lc.m.cleanup.retain_hours * 3600 + 60)
    deleted = lc.proxy.ttl_sweep()  # the sweeper thread would too, within ttl_sweep_seconds
    lc.log(f"TTL deleted {deleted} expired items")
    return True


def strip(lc: Lifecycle) -> None:
    """`reshard cleanup --strip-bookkeeping` (in complete): the versions and markers go."""
    r = lc.cli("--output", "json", "cleanup", lc.m.id, "--segments", "8", "--strip-bookkeeping", timeout=180)
    assert r.returncode == 0, f"{r.stdout[-2000:]} {r.stderr[-2000:]}"
    lc.log(f"strip: {json.loads(r.stdout).get('counts')}")


def report(name: str, seed: int, result: dict) -> None:
    print(f"\n[{name}] seed {seed}: " + json.dumps(result["figures"], sort_keys=True))
    print(f"[{name}] lost {len(result['lost'])}, resurrected {len(result['resurrected'])}, "
          f"stale {len(result['stale'])}, duplicated {len(result['duplicated'])}, "
          f"old copies left {len(result['old_copies_left'])}, unmoved changed {len(result['unmoved_changed'])}")


def assert_clean(lc: Lifecycle, result: dict, cleaned: bool) -> None:
    violations = [v for a in lc.apps for v in a.violations]
    if violations:
        dump = lc.path.parent / "violations.txt"
        dump.write_text("\n".join(violations))
        print(f"violations written to {dump}")
        for v in violations:
            print(v)
    assert violations == [], violations[:10]
    for k in ("lost", "resurrected", "stale", "duplicated", "old_copies_left", "unmoved_changed",
              "unmappable_changed", "frozen_landed"):
        assert result[k] == [], f"{k}: {result[k][:10]}"
    crashed = [e for a in lc.apps for e in a.errors if "crashed" in e]
    assert crashed == [], crashed


def test_calculated_suffix_16_to_32_under_chaos(tmp_path):
    lc = Lifecycle(tmp_path, "sensor", SEED, n_items=800, n_inserts=150)  # one fenced PutItem per moved item: kept under ~90 s
    try:
        lc.seed_table()
        lc.start_app(seconds=150, max_ops=6000)
        lc.move(Action.ADVANCE)                 # dual_write
        lc.move(Action.ADVANCE)                 # dual_read
        lc.move(Action.ROLLBACK)                # back to dual_write
        lc.move(Action.ADVANCE)                 # dual_read
        lc.move(Action.ADVANCE, dwell=0.3)      # backfill
        summary = lc.backfill_with_kills(kills=4)
        assert summary["finished"] and summary["unmappable"] == 0
        verify(lc)
        lc.move(Action.ADVANCE)                 # cutover
        lc.move(Action.ROLLBACK)                # back to backfill
        verify(lc)
        lc.move(Action.ADVANCE)                 # cutover
        verify(lc)                              # the catch-up verify after the switch
        lc.move(Action.ADVANCE)                 # cleanup
        cleaned = cleanup(lc)
        lc.move(Action.ADVANCE)                 # complete
        lc.stop_app()
        result = lc.audit(cleaned)
        report("sensor 16->32", SEED, result)
        f = result["figures"]
        # The chaos really happened (else the zeros below prove nothing).
        assert lc.kills >= 3, f"only {lc.kills} SIGKILLs landed"
        # (No "split" BatchWriteItem faults any more: the data jobs write one fenced item per request.)
        assert f["faults"]["throttle"] >= 20 and f["faults"]["5xx"] >= 10, f["faults"]
        assert all(f["ops"].get(k, 0) >= 20 for k in ("put", "insert", "update", "delete", "ryw_read")), f["ops"]
        assert f["transitions"].count("dual_read->dual_write") == 1
        assert f["transitions"].count("cutover->backfill") == 1
        assert lc.phase().value == "complete"
        lc.assert_late_faults_met(f["behaviours"])
        assert_clean(lc, result, cleaned)
    finally:
        lc.close()


def test_hybrid_time_bucket_16_to_64_under_chaos(tmp_path):
    """Items store neither sensor_id nor ts (they live only in the keys); a few cannot be mapped.

    On every DynamoDB behaviour of the fidelity proxy (issue 29): stale non-consistent reads
    (the jobs' scans), a per-key partition limit, unprocessed batch items, TTL deleting the
    old copies late after cleanup marked them; and with issue 25's late requests, lost
    answers and late duplicates, the server deadline enforced (horizon LATE_HORIZON)."""
    unmappable = [
        {"PK": {"S": "3#2024-10-27T15"}, "SK": {"S": "s-1#not-a-time"}, "temp": {"N": "1"}},          # bad ts
        {"PK": {"S": "5#2024-10-27T15"}, "SK": {"S": "no-separator"}, "temp": {"N": "2"}},            # no '#'
        {"PK": {"S": "7#2024-10-27T15"}, "SK": {"S": "s#x#2024-10-27T15:00:00Z"}, "temp": {"N": "3"}},  # '#' in a field
        {"PK": {"S": "9#2024-10-27T15"}, "SK": {"S": "s-2#2024-10-27T16:00:00Z"}, "temp": {"N": "4"}},  # wrong bucket
    ]
    lc = Lifecycle(tmp_path, "hourly", SEED + 1, n_items=500, n_inserts=80, fidelity=EVERY_BEHAVIOUR,
                   late_faults=True)
    try:
        lc.seed_table(unmappable, store_key_fields=False)
        lc.start_app(seconds=90, max_ops=3000)
        lc.start_frozen_shim()
        # (The rollbacks of dual_read and cutover are the calculated-suffix test's: not repeated here.)
        lc.move(Action.ADVANCE)                 # dual_write
        lc.move(Action.ADVANCE)                 # dual_read
        lc.move(Action.ADVANCE, dwell=0.3)      # backfill
        summary = lc.backfill_with_kills(kills=1)
        assert summary["finished"]
        report_ = unmappable_items(lc.store, lc.m.id)
        print(f"\n[hourly] unmappable report: {[(u['old_key'], u['reason']) for u in report_]}")
        assert summary["unmappable"] >= len(unmappable)
        assert sorted(json.dumps(u["old_key"], sort_keys=True) for u in report_) == sorted(
            json.dumps({"PK": u["PK"], "SK": u["SK"]}, sort_keys=True) for u in unmappable)
        # Unmappable items fail a verify unless the operator allows them: `start --allow-unmappable 4`
        # (Lifecycle.start_app) allowed exactly the planted ones.
        assert allowed_unmappable(lc.store, lc.m.id) == len(unmappable)
        verify(lc)
        lc.move(Action.ADVANCE)                 # cutover
        verify(lc)                              # the catch-up verify after the switch
        lc.freeze_frozen_shim()                 # a shim process frozen across complete and strip
        lc.move(Action.ADVANCE)                 # cleanup (the census watched the frozen shim go silent)
        cleaned = cleanup(lc)
        lc.overwrite_frozen_keys()              # another shim puts and deletes its keys
        lc.move(Action.ADVANCE)                 # complete
        strip(lc)
        frozen = lc.resume_frozen_shim()        # what it had in flight must not land
        lc.stop_app()
        result = lc.audit(cleaned)
        result["figures"]["frozen_shim"] = frozen
        report("hourly 16->64", SEED + 1, result)
        f = result["figures"]
        assert frozen["acked"] >= 5 and len(lc.frozen_final) == len(lc.frozen_keys), (frozen, lc.frozen_final)
        assert f["faults"]["throttle"] >= 5 and f["faults"]["5xx"] >= 3, f["faults"]
        assert all(f["ops"].get(k, 0) >= 10 for k in ("put", "update", "delete", "ryw_read")), f["ops"]
        # The behaviours were met (else the zeros below prove nothing about them).
        b = f["behaviours"]
        assert b.get("stale_items", 0) >= 1 and b.get("ttl_deleted", 0) >= 100, b
        assert b.get("partition_throttles", 0) + b.get("unprocessed_items", 0) >= 1, b
        lc.assert_late_faults_met(b)
        assert_clean(lc, result, cleaned)
    finally:
        lc.close()
