"""``reshard demo`` at a small size: it must finish green, and its report must be true.

The demo runs on its own embedded moto server (``--endpoint-url``, started here so
the table outlives the run); the test then scans that table itself and recomputes
the numbers the report claims, with the reference article's hash written out (not
reshard's key mapping).
"""

from __future__ import annotations

import hashlib
import json

import boto3
import pytest

from reshard.cli.main import main
from reshard.aws.local import EmbeddedDynamoDB

FROM, TO = 4, 8


def shard(event_id: str, n: int) -> int:
    return int(hashlib.sha256(event_id.encode()).hexdigest(), 16) % n


@pytest.fixture(scope="module")
def demo_run():
    with EmbeddedDynamoDB() as server:
        import io
        from contextlib import redirect_stderr, redirect_stdout
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = main(["demo", "--endpoint-url", server.endpoint_url, "--items", "200", "--from-shards", str(FROM),
                         "--to-shards", str(TO), "--app-threads", "2", "--segments", "4", "--output", "json"])
        client = boto3.client("dynamodb", endpoint_url=server.endpoint_url, region_name="us-east-1")
        items, kwargs = [], {"TableName": "SensorEvents", "ConsistentRead": True}
        while True:
            resp = client.scan(**kwargs)
            items += resp["Items"]
            if "LastEvaluatedKey" not in resp:
                break
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        yield code, out.getvalue(), err.getvalue(), items


def test_demo_exits_zero_with_a_green_report(demo_run):
    code, out, err, _ = demo_run
    report = json.loads(out)
    assert code == 0, (report.get("failures"), err[-2000:])
    assert report["ok"] is True and report["failures"] == []
    assert report["phase"] == "complete"
    assert [p["phase"] for p in report["phases"]] == ["dual_write", "dual_read", "backfill", "cutover", "cleanup",
                                                      "complete"]
    app = report["app"]
    assert app["errors"] == 0 and app["violations"] == 0
    assert app["total"] > 0 and all(app["ops"][k] > 0 for k in ("put", "update", "delete", "get"))
    # traffic ran in every phase, not only before or after the migration
    assert {"dual_write", "dual_read", "backfill", "cutover", "cleanup"} <= set(app["by_phase"])
    assert report["steps"]["verify"]["passed"] is True
    bf = report["steps"]["backfill"]
    assert bf["done"] is True and not {"recopied", "undone"} & set(bf)
    assert bf["copied"] + bf["fenced"] + bf["duplicates"] + bf["collisions"] == bf["moved"] > 0
    assert report["steps"]["cleanup"]["done"] is True
    fc = report["final_check"]
    assert fc["mismatches"] == 0 and fc["resurrected"] == 0
    assert fc["missing_in_new_layout"] == 0 and fc["duplicates"] == 0


def test_demo_report_matches_the_table(demo_run):
    """Live items, moved items and the new distribution, recomputed from a raw scan."""
    _, out, _, items = demo_run
    report = json.loads(out)
    live_new = [i for i in items if "_rs_del" not in i
                and int(i["PK"]["S"].rsplit("#", 1)[1]) == shard(i["event_id"]["S"], TO)]
    keys = [(i["sensor_id"]["S"], i["event_id"]["S"], i["SK"]["S"]) for i in live_new]
    assert len(keys) == len(set(keys)), "a logical item has two copies in the new layout"
    moved = sum(1 for _, e, _ in keys if shard(e, FROM) != shard(e, TO))
    fc = report["final_check"]
    assert fc["live"] == len(keys)
    assert fc["moved_items"] == moved
    assert 0 < moved < len(keys)  # 4 -> 8: about half the items change key
    after = [0] * TO
    for _, e, _ in keys:
        after[shard(e, TO)] += 1
    assert report["after"]["counts"] == after
    assert report["before"]["total"] == 200 and report["before"]["shards"] == FROM
    # Every old-layout copy left got the TTL attribute (moto never expires it); items
    # created in cleanup/complete were written to the new layout only, so have none.
    old_of_moved = [i for i in items if "_rs_del" not in i
                    and int(i["PK"]["S"].rsplit("#", 1)[1]) != shard(i["event_id"]["S"], TO)]
    assert all("expires_at" in i for i in old_of_moved)
    assert fc["old_items_with_ttl"] == len(old_of_moved) > 0
