"""``reshard plan``'s move comparison: the file's [to] layout vs the same with ``hash = "jump"``.

Expected counts are computed here with plain hashlib and the jump function (itself pinned
to published test vectors in tests/unit/test_jump_hash.py), not with reshard's layouts.
"""

from __future__ import annotations

import hashlib

from reshard.core.layout import jump_hash

from tests.functional.test_plan import ROOT, create, fill, plan_json, run_plan, sha

JUMP_FILE = str(ROOT / "migrations" / "0004_sensor_events_jump.toml")
SENSOR = str(ROOT / "migrations" / "0001_sensor_events.toml")


def jkey(s: str) -> int:
    return int.from_bytes(hashlib.sha256(s.encode()).digest()[:8], "big")


def items_mod(n: int, shards: int) -> list[str]:
    return [f"evt-{i:05d}" for i in range(n)]


def fill_mod(dynamo, events: list[str], shards: int) -> None:
    create(dynamo, "SensorEvents")
    fill(dynamo, "SensorEvents", [
        {"PK": {"S": f"sensor-{i % 5}#{sha(e) % shards}"}, "SK": {"S": f"2024-10-27T15:00:{i:05d}Z"},
         "sensor_id": {"S": f"sensor-{i % 5}"}, "event_id": {"S": e}} for i, e in enumerate(events)])


def count(events, pred) -> int:
    return sum(1 for e in events if pred(e))


def test_plan_compares_a_mod_target_with_jump(moto_dynamo, capsys):
    events = items_mod(300, 16)
    fill_mod(moto_dynamo, events, 16)
    r = plan_json(capsys, SENSOR, "--sample", "0", "--segments", "2")
    mv = r["moves"]
    t, j = mv["layouts"]["target"], mv["layouts"]["jump"]
    assert mv["sampled"] == 300 and t["hash"] == "sha256" and j["hash"] == "jump"
    assert t["this_migration"]["sampled_items"] == count(events, lambda e: sha(e) % 32 != sha(e) % 16) \
        == r["items"]["moves"]
    assert t["doubling"] == {"to_shards": 64, "sampled_items": count(events, lambda e: sha(e) % 64 != sha(e) % 32),
                             "fraction": round(count(events, lambda e: sha(e) % 64 != sha(e) % 32) / 300, 4),
                             "estimated_items": count(events, lambda e: sha(e) % 64 != sha(e) % 32)}
    assert t["growth"]["to_shards"] == 48
    assert t["growth"]["sampled_items"] == count(events, lambda e: sha(e) % 48 != sha(e) % 32)
    assert j["this_migration"]["sampled_items"] == count(events, lambda e: jump_hash(jkey(e), 32) != sha(e) % 16)
    assert j["doubling"]["sampled_items"] == count(events, lambda e: jump_hash(jkey(e), 64) != jump_hash(jkey(e), 32))
    assert j["growth"]["sampled_items"] == count(events, lambda e: jump_hash(jkey(e), 48) != jump_hash(jkey(e), 32))
    # 16 -> 32 is a doubling: % keeps half, jump would re-key ~97% now and save only on odd growths.
    assert mv["recommend_jump"] is False and mv["advice"].startswith("jump not recommended")
    rc, out, _ = run_plan(capsys, SENSOR, "--sample", "0", "--segments", "2")
    assert rc == 0 and "Items that move" in out and "[to] with jump" in out and mv["advice"] in out
    # The existing keys are untouched.
    assert {"items", "distribution", "capacity", "recommendation", "warnings", "next"} <= set(r)


def test_plan_recommends_jump_where_it_pays(moto_dynamo, capsys, tmp_path):
    # 10 -> 16 with %: keeps ~1/8 now and a later 16 -> 24 moves ~2/3; jump moves ~1/3 then.
    events = items_mod(300, 10)
    fill_mod(moto_dynamo, events, 10)
    path = tmp_path / "m.toml"
    path.write_text((ROOT / "migrations" / "0001_sensor_events.toml").read_text()
                    .replace("shards = 16", "shards = 10"))
    r = plan_json(capsys, str(path), "--sample", "0")
    mv = r["moves"]
    t, j = mv["layouts"]["target"], mv["layouts"]["jump"]
    assert (t["shards"], t["growth"]["to_shards"]) == (32, 48)
    assert j["this_migration"]["sampled_items"] == count(events, lambda e: jump_hash(jkey(e), 32) != sha(e) % 10)
    assert t["this_migration"]["sampled_items"] == count(events, lambda e: sha(e) % 32 != sha(e) % 10)
    now = j["this_migration"]["fraction"] - t["this_migration"]["fraction"]
    later = t["growth"]["fraction"] - j["growth"]["fraction"]
    assert now < later
    assert mv["recommend_jump"] is True and mv["advice"].startswith('recommended: hash = "jump"')


def test_plan_of_a_jump_target(moto_dynamo, capsys):
    events = items_mod(200, 16)
    fill_mod(moto_dynamo, events, 16)
    r = plan_json(capsys, JUMP_FILE, "--sample", "0")
    assert r["migration"]["to"]["hash"] == "jump"
    moved = count(events, lambda e: jump_hash(jkey(e), 32) != sha(e) % 16)
    assert r["items"]["moves"] == moved
    assert r["distribution"]["new"]["counts"] == [
        count(events, lambda e, s=s: jump_hash(jkey(e), 32) == s) for s in range(32)]
    mv = r["moves"]
    assert mv["recommend_jump"] is None and mv["layouts"]["target"]["hash"] == "jump"
    assert mv["layouts"]["target"]["this_migration"]["sampled_items"] == moved
    # Growing a jump layout never moves an item between two old shards: only into 32..47.
    assert mv["layouts"]["target"]["growth"]["sampled_items"] == count(
        events, lambda e: jump_hash(jkey(e), 48) >= 32)
    rc, out, _ = run_plan(capsys, JUMP_FILE, "--sample", "0")
    assert rc == 0 and "[to] with jump" not in out and "shard = jump(sha256(event_id)[:8], 32)" in out
