"""moto with reshard's speed-ups (installed by tests/conftest.py) still answers as DynamoDB does.

The speed-ups replace moto's Query item lookup, its Scan sort and its attribute-value
serializer (reshard/aws/moto_speedups.py); every test on moto runs on them, and this one
checks the answers they touch against the data written: each item once per scan, a query
returns exactly its partition in sort-key order (both directions, across pages), and every
attribute type (binaries in sets, maps and lists too) reads back as written.
"""

from __future__ import annotations

import os
import pathlib
import random
import subprocess
import sys
from decimal import Decimal

import boto3
import pytest
from moto import mock_aws
from moto.dynamodb.models.table import Table

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _value(rng: random.Random, kind: str) -> dict:
    if kind == "S":
        return {"S": rng.choice(["a", "B", "é", ""]) + str(rng.randint(0, 40))}
    if kind == "N":
        return {"N": str(Decimal(rng.randint(-10**6, 10**6)) / rng.choice([1, 10, 1000]))}
    return {"B": bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 3)))}


def _sort_key(v: dict):
    (kind, x), = v.items()
    return Decimal(x) if kind == "N" else x


@pytest.mark.parametrize("hash_type,range_type", [("S", "N"), ("N", "S"), ("S", "B"), ("S", None)])
def test_scan_and_query_answer_as_written(hash_type, range_type):
    assert Table.query.__name__ == "partition_query"  # the speed-ups are what runs here
    rng = random.Random(7)
    with mock_aws():
        c = boto3.client("dynamodb", region_name="us-east-1")
        schema = [{"AttributeName": "h", "KeyType": "HASH"}]
        attrs = [{"AttributeName": "h", "AttributeType": hash_type}]
        if range_type:
            schema.append({"AttributeName": "r", "KeyType": "RANGE"})
            attrs.append({"AttributeName": "r", "AttributeType": range_type})
        c.create_table(TableName="speedups", BillingMode="PAY_PER_REQUEST", KeySchema=schema,
                       AttributeDefinitions=attrs)
        hashes = [_value(rng, hash_type) for _ in range(3)]
        written = {}
        for i in range(24):
            item = {"h": rng.choice(hashes), "i": {"N": str(i)}, "bs": {"BS": [b"\x00", bytes([i])]},
                    "m": {"M": {"b": {"B": b"\xff" * (i % 3 + 1)}, "l": {"L": [{"NULL": True}, {"B": b"q"}]}}}}
            if range_type:
                item["r"] = _value(rng, range_type)
            c.put_item(TableName="speedups", Item=item)
            written[repr((item["h"], item.get("r")))] = item
        seen = []
        for segment in range(3):
            kwargs = {"TableName": "speedups", "Segment": segment, "TotalSegments": 3, "Limit": 4}
            for _ in range(50):  # bounded: a broken order could page forever
                page = c.scan(**kwargs)
                seen += page["Items"]
                if "LastEvaluatedKey" not in page:
                    break
                kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        by_key = {repr((i["h"], i.get("r"))): i for i in seen}
        assert len(seen) == len(by_key) == len(written) and by_key == written
        for h in hashes:
            want = sorted((i for i in written.values() if i["h"] == h),
                          key=lambda i: _sort_key(i["r"]) if range_type else 0)
            for forward in (True, False):
                got, kwargs = [], {"TableName": "speedups", "KeyConditionExpression": "h = :h",
                                   "ExpressionAttributeValues": {":h": h}, "Limit": 3, "ScanIndexForward": forward}
                for _ in range(50):
                    page = c.query(**kwargs)
                    got += page["Items"]
                    if "LastEvaluatedKey" not in page:
                        break
                    kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
                assert got == (want if forward else want[::-1])


def test_the_speedups_run_only_on_the_moto_they_were_checked_against(tmp_path):
    """A moto whose patched (or relied-on) code differs from every release checked is left
    unpatched with one warning, or refused outright with strict=True (the test suite's way)."""
    from reshard.aws import moto_speedups

    assert moto_speedups.active()  # conftest installed them (strict): this moto is one checked
    name = "moto.dynamodb.models.table:Table.query"
    script = ("import logging; logging.basicConfig(); from reshard.aws import moto_speedups as m\n"
              f"m.KNOWN_SOURCES[{name!r}] = frozenset({{'0000000000000000'}})\n"
              "print(m.install(), m.install())\n"
              "m._installed = False\n"
              "try:\n    m.install(strict=True)\nexcept m.MotoNotRecognised as e:\n    print('refused:', e)\n"
              "from moto.dynamodb.models.table import Table; print(Table.query.__name__)")
    env = {k: v for k, v in os.environ.items() if k != "RESHARD_MOTO_SPEEDUPS"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         cwd=str(tmp_path), env={**env, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    lenient, strict, query = run.stdout.splitlines()
    assert lenient == "False False"                                   # nothing patched, said once:
    assert run.stderr.count("not what reshard's moto speed-ups were checked against") == 1
    assert "changed: moto.dynamodb.models.table:Table.query" in run.stderr
    assert strict.startswith("refused: moto ") and "Table.query" in strict  # the test suite's way
    assert query == "query"                                           # moto's own Query, unpatched


def test_a_fingerprint_follows_the_source(tmp_path, monkeypatch):
    from reshard.aws.moto_speedups import fingerprint

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "fp_probe_a.py").write_text("class T:\n    def f(self):\n        return 1\n")
    (tmp_path / "fp_probe_b.py").write_text("class T:\n    def f(self):\n        return 2\n")
    a, b = fingerprint("fp_probe_a:T.f"), fingerprint("fp_probe_b:T.f")
    assert len(a) == 16 and a != b and fingerprint("fp_probe_a:T.g") == "missing"


def test_one_compare_and_set_wins_across_threads(monkeypatch):
    """Two threads put one key under `attribute_not_exists`: exactly one wins. Forced: each
    request waits (at most 0.5 s) after moto read the current item, for the other request to
    have read it too. Without reshard's lock (``_one_request_at_a_time``) both read "absent",
    both pass the condition and both writes are acknowledged (two workers once claimed one
    segment this way in CI); with it the second request only reads once the first wrote."""
    import threading

    from botocore.exceptions import ClientError

    barrier = threading.Barrier(2, timeout=0.5)
    real_get = Table.get_item
    racing = threading.local()

    def get_item(self, *args, **kwargs):
        got = real_get(self, *args, **kwargs)
        if getattr(racing, "on", False):
            racing.on = False
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                pass  # serialised: the other request is not in moto yet
        return got

    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        client.create_table(TableName="cas", KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                            BillingMode="PAY_PER_REQUEST")
        monkeypatch.setattr(Table, "get_item", get_item)
        outcomes: list[str] = []

        def claim(who: str) -> None:
            racing.on = True
            try:
                client.put_item(TableName="cas", Item={"pk": {"S": "seg-1"}, "owner": {"S": who}},
                                ConditionExpression="attribute_not_exists(pk)")
                outcomes.append("won")
            except ClientError as e:
                outcomes.append(e.response["Error"]["Code"])

        threads = [threading.Thread(target=claim, args=(w,)) for w in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert sorted(outcomes) == ["ConditionalCheckFailedException", "won"]
