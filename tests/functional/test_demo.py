"""``reshard demo`` at a small size: it must finish green, and its report must be true.

The demo runs on its own embedded moto server (``--endpoint-url``, started here so
the table outlives the run); the test then scans that table itself and recomputes
the numbers the report claims, with the reference article's hash written out (not
reshard's key mapping).
"""

from __future__ import annotations

import hashlib
import json
import re

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


#: Words of reshard's internals a reader of the demo cannot know (issue 27): its lines and
#: report say what happened instead.
INTERNAL_WORDS = ("fenced", "changed_meanwhile", "gsi_", "tombstone", "_retired", "new_layout", "new_copies",
                  "phase version", "unmoved", "untouched", "expiring")


def numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"(?<![\w.])(\d+)(?![\w.])", text)]


def test_demo_says_what_happened_in_words_whose_numbers_add_up(demo_run):
    from reshard.demo import render_report

    _, out, err, _ = demo_run
    report = json.loads(out)
    text = render_report(report)
    shown = text + "\n" + err                       # the report and the lines printed as it ran
    assert [w for w in INTERNAL_WORDS if w in shown] == []
    line = {m.group(1): m.group(2) for m in re.finditer(r"(?m)^(\w[\w ]*?): +(.*(?:\n {14}.*)*)", text)}
    # app traffic: the kinds add up to the total, and so do the phases
    total, *kinds = numbers(line["app traffic"].split(":")[0])
    assert total == sum(kinds[1:])                  # kinds[0]: the number of app threads
    per_phase = numbers(line["app traffic"].split("per phase:")[1])
    assert sum(per_phase) == total
    # items: live = loaded + put - deleted = changed key + kept
    m = re.match(r"(\d+) live at the end = (\d+) loaded \+ (\d+) put by the app - (\d+) it deleted; (\d+) of them "
                 r"changed key \(\d+ -> \d+ shards\), (\d+) kept theirs", line["items"])
    live, loaded, put, deleted, moved, kept = map(int, m.groups())
    assert live == loaded + put - deleted == moved + kept and loaded == 200
    # backfill and cleanup: the parts after "read N items:" add up to N, the copied and the
    # skipped to the old items whose key changes
    for job in ("backfill", "cleanup"):
        read, rest = re.match(r"read (\d+) items: (.*)", line[job], re.S).groups()
        parts = [numbers(p)[0] for p in rest.split("\n")[0].split("; ")]
        assert sum(parts) == int(read), (job, line[job])
    changing = re.search(r"(\d+) old items \(delete markers included\) whose key changes: ([^;]*)", line["backfill"])
    assert int(changing.group(1)) == sum(numbers(changing.group(2)))
    # verify: the items it read split into three kinds
    read, new, same, changing = numbers(re.search(r"read \d+ items of both layouts \([^)]*\)", line["verify"]).group())
    assert read == new + same + changing and "no differences" in line["verify"]
    # final check: every key ever written = live + deleted
    checked, live2, _, deleted2, *_ = numbers(line["final check"])
    assert (checked, live2, deleted2) == (live + deleted, live, deleted)
    # time: the parts add up to the whole (each rounded to 0.1 s)
    total_s = float(re.match(r"([\d.]+) s", line["time"]).group(1))
    parts_s = [float(x) for x in re.findall(r"(?<=[a-z] )([\d.]+)(?:,|$)", line["time"].split(" = ", 1)[1])]
    assert len(parts_s) == 8 and abs(sum(parts_s) - total_s) <= 0.1 * len(parts_s)
