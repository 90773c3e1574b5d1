"""docs/metrics.md is the one table of every metric, and the alarm samples in deploy/ parse and
use only metrics that table names (Prometheus rules: job metrics as exported, the shim's as the
OpenTelemetry Prometheus exporter names them; CloudWatch: EMF names and the shim's instruments)."""

from __future__ import annotations

import json
import pathlib
import re

import yaml

from reshard.core.metrics import COUNTER, HISTOGRAM, JOB_METRICS, SHIM_METRICS

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "metrics.md").read_text()


def doc_rows(header: str) -> list[list[str]]:
    """The rows of the markdown table whose header line starts with ``header``."""
    lines = DOC.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split(" | ")])
    return rows


def test_the_doc_table_is_the_code_table():
    jobs = doc_rows("| Prometheus name")
    assert [(r[0].strip("`"), r[1], r[2], r[3], r[5]) for r in jobs] == \
        [(m.name, m.kind, m.unit, f"`{m.emf}` ({m.emf_unit})", m.help) for m in JOB_METRICS]
    shim = doc_rows("| OpenTelemetry instrument")
    assert [(r[0].strip("`"), r[1], r[2].strip("`"), r[4]) for r in shim] == \
        [(m.name, m.kind, m.unit, m.help) for m in SHIM_METRICS]


def test_names_follow_the_conventions():
    for m in JOB_METRICS:
        assert re.fullmatch(r"reshard_job_[a-z_]+", m.name)
        assert m.name.endswith("_total") == (m.kind == COUNTER), m.name  # counters, and only they
        assert re.fullmatch(r"[A-Z][A-Za-z]+", m.emf)
    assert len({m.emf for m in JOB_METRICS}) == len(JOB_METRICS)
    for m in SHIM_METRICS:
        assert re.fullmatch(r"reshard\.shim\.[a-z.]+", m.name) and "reshard.migration" in m.attributes


def prometheus_names() -> set[str]:
    """Every series name a Prometheus server can hold for the documented metrics."""
    names = {m.name for m in JOB_METRICS}
    for m in SHIM_METRICS:  # the OpenTelemetry Prometheus exporter's naming: dots to _, unit, _total
        base = m.name.replace(".", "_") + ("_seconds" if m.unit == "s" else "")
        if m.kind == COUNTER:
            names.add(base + "_total")
        elif m.kind == HISTOGRAM:
            names |= {base + suffix for suffix in ("_bucket", "_count", "_sum")}
        else:
            names.add(base)
    return names


def test_prometheus_rules_parse_and_use_documented_metrics():
    doc = yaml.safe_load((ROOT / "deploy" / "prometheus" / "reshard-alerts.yml").read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} >= {"ReshardShimsHeldBySwitch", "ReshardMirrorFailures",
                                           "ReshardThrottlesSustained", "ReshardEtaGrowing",
                                           "ReshardLeaseTakenOverRepeatedly"}
    known = prometheus_names()
    labels = {a.replace(".", "_") for m in SHIM_METRICS for a in m.attributes}  # the shim's, as labels
    for r in rules:
        used = set(re.findall(r"\breshard_[a-z_]+", r["expr"])) - labels
        assert used and used <= known, (r["alert"], used - known)
        assert r["annotations"]["runbook"].startswith("runbooks/metrics-and-alarms.md#")


def test_cloudwatch_alarms_parse_and_use_documented_metrics():
    template = json.loads((ROOT / "deploy" / "cloudwatch" / "reshard-alarms.json").read_text())
    alarms = template["Resources"]
    assert all(a["Type"] == "AWS::CloudWatch::Alarm" for a in alarms.values())
    assert set(alarms) >= {"ShimsHeldBySwitch", "MirrorFailures", "ThrottlesSustained", "EtaGrowing",
                           "LeaseTakenOverRepeatedly"}
    known = {m.emf for m in JOB_METRICS} | {m.name for m in SHIM_METRICS}
    for name, alarm in alarms.items():
        p = alarm["Properties"]
        metrics = [p] if "MetricName" in p else [q["MetricStat"]["Metric"] for q in p["Metrics"] if "MetricStat" in q]
        assert metrics, name
        for m in metrics:
            assert m["MetricName"] in known, (name, m["MetricName"])
            job_metric = m["MetricName"] in {j.emf for j in JOB_METRICS}
            assert m["Namespace"] == ("reshard" if job_metric else {"Ref": "ShimNamespace"}), name
        refs = re.findall(r'"Ref": "([A-Za-z]+)"', json.dumps(p))
        assert set(refs) <= set(template["Parameters"]), name


def test_every_runbook_anchor_the_samples_name_exists():
    text = (ROOT / "runbooks" / "metrics-and-alarms.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^## (.+)$", text, re.M)}
    samples = (ROOT / "deploy" / "prometheus" / "reshard-alerts.yml").read_text() + \
        (ROOT / "deploy" / "cloudwatch" / "reshard-alarms.json").read_text()
    used = set(re.findall(r"metrics-and-alarms\.md#([a-z0-9-]+)", samples))
    assert used and used <= anchors, used - anchors
