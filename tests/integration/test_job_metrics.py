"""A data job's metrics on dynalite: Prometheus text scraped during a run (parsed with
prometheus_client's own parser) and CloudWatch EMF lines (checked against EMF's JSON schema).
The names come from one table (reshard.core.metrics, docs/metrics.md)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reshard.cli.main import main
from reshard.core.metrics import JOB_METRIC_NAMES
from reshard.jobs.metrics import JobMetrics, PrometheusExporter
from reshard.jobs.runner import JobOptions
from reshard import operations

from tests.backfill_support import logical, setup_migration

#: CloudWatch's embedded metric format, as its specification states it (the parts a line must have).
EMF_SCHEMA = {
    "type": "object",
    "required": ["_aws"],
    "properties": {"_aws": {
        "type": "object", "required": ["Timestamp", "CloudWatchMetrics"],
        "properties": {
            "Timestamp": {"type": "integer", "minimum": 0},
            "CloudWatchMetrics": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["Namespace", "Dimensions", "Metrics"],
                "properties": {
                    "Namespace": {"type": "string", "minLength": 1, "maxLength": 1024},
                    "Dimensions": {"type": "array", "items": {"type": "array", "maxItems": 30,
                                                              "items": {"type": "string", "minLength": 1}}},
                    "Metrics": {"type": "array", "maxItems": 100, "items": {
                        "type": "object", "required": ["Name"],
                        "properties": {"Name": {"type": "string", "minLength": 1, "maxLength": 1024},
                                       "Unit": {"enum": ["Seconds", "Microseconds", "Milliseconds", "Bytes",
                                                         "Kilobytes", "Megabytes", "Gigabytes", "Terabytes", "Bits",
                                                         "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent",
                                                         "Count", "Bytes/Second", "Kilobytes/Second",
                                                         "Megabytes/Second", "Gigabytes/Second", "Terabytes/Second",
                                                         "Bits/Second", "Kilobits/Second", "Megabits/Second",
                                                         "Gigabits/Second", "Terabits/Second", "Count/Second",
                                                         "None"]}}}}}}}}}},
}


def table_of(dynalite, name: str, n: int):
    m, mapper, store = setup_migration(dynalite, "invoices", name, control=name + "-c", mid=name)
    dynalite.batch_write(m.table, [{"PutRequest": {"Item": mapper.to_physical(logical("invoices", i), mapper.old,
                                                                              i % mapper.old.shards)}}
                                   for i in range(n)])
    return m, store


def scrape(port: int) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_metrics_port_is_scraped_during_a_run_and_parsed_by_prometheus_client(dynalite, unique_name):
    m, store = table_of(dynalite, unique_name, 240)
    metrics = JobMetrics("backfill", m.id, 2, total=lambda: (240, "test"))
    exporter = PrometheusExporter(metrics, 0, "127.0.0.1")
    opts = JobOptions(segments=2, page_size=20, max_wcu=150, workers=2)  # ~2 s at the budget
    scrapes, errors_ = [], []
    done = threading.Event()

    def scraper():
        while not done.is_set():
            try:
                scrapes.append(scrape(exporter.port))
            except Exception as e:  # noqa: BLE001 - the assertion below shows it
                errors_.append(repr(e))
            time.sleep(0.2)

    t = threading.Thread(target=scraper)
    t.start()
    try:
        result = operations.run_data_job("backfill", dynalite, store, m.id, opts, subscribers=[metrics])
    finally:
        done.set()
        t.join(5)
    final = scrape(exporter.port)
    exporter.close()
    assert result.done and not errors_, errors_
    mid_run = [s for s in scrapes if 0 < s.get("reshard_job_items_copied_total", [({}, 0)])[0][1]
               < result.totals["copied"]]
    assert mid_run, "no scrape caught the run in progress"
    every = {name for s in scrapes + [final] for name in s}
    # Every sample is a documented metric (counters appear with _total, as the table names them).
    assert every <= set(JOB_METRIC_NAMES), every - set(JOB_METRIC_NAMES)
    labels, scanned = final["reshard_job_items_scanned_total"][0]
    # The scan also meets the copies it wrote (new_layout): the run's own counter says how many.
    assert labels == {"migration": m.id, "job": "backfill"} and scanned == result.totals["scanned"] >= 240
    assert final["reshard_job_items_copied_total"][0][1] == result.totals["copied"] > 0
    assert final["reshard_job_write_capacity_budget_units_per_second"][0][1] == 150
    consumed = final["reshard_job_consumed_write_capacity_units_total"][0][1]
    assert consumed >= result.totals["copied"]  # one WCU at least per copy
    assert final["reshard_job_paused"][0][1] == 0
    assert final["reshard_job_phase"][0] == ({"migration": m.id, "job": "backfill", "phase": "backfill"}, 3)
    assert final["reshard_job_progress_ratio"][0][1] == 1.0


def test_emf_lines_match_the_embedded_metric_format(dynalite, dynalite_server, unique_name, capsys):
    m, store = table_of(dynalite, unique_name, 80)
    code = main(["--endpoint-url", dynalite_server.endpoint, "--control-table", store.table, "backfill", m.id,
                 "--segments", "2", "--page-size", "20", "--max-wcu", "60", "--metrics", "emf",
                 "--metrics-interval", "0.3"])
    out = capsys.readouterr().out
    assert code == 0, out
    docs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(docs) >= 3, out  # lines during the run (~1.5 s at the budget) and the last one
    for doc in docs:
        jsonschema.validate(doc, EMF_SCHEMA)
        directive = doc["_aws"]["CloudWatchMetrics"][0]
        assert directive["Namespace"] == "reshard"
        for dims in directive["Dimensions"]:
            assert all(d in doc for d in dims)  # every dimension is a member of the line
        for metric in directive["Metrics"]:
            assert isinstance(doc[metric["Name"]], (int, float))  # every metric has its value
        assert (doc["Migration"], doc["Job"]) == (m.id, "backfill")
    # Counters are increases since the line before: together they are the run's totals.
    main_lines = [d for d in docs if "Reason" not in d]
    assert sum(d.get("ItemsScanned", 0) for d in main_lines) >= 80  # copies met by the scan count too
    assert {"ConsumedWriteCapacityUnits", "WriteCapacityBudget", "Paused", "Phase"} <= set(main_lines[-1])
    emf_names = {metric.emf for metric in JOB_METRIC_NAMES.values()}
    assert {mm["Name"] for d in docs for mm in d["_aws"]["CloudWatchMetrics"][0]["Metrics"]} <= emf_names


def test_a_busy_metrics_port_is_one_clear_line(dynalite, dynalite_server, unique_name, capsys):
    import socket
    m, store = table_of(dynalite, unique_name, 4)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code = main(["--endpoint-url", dynalite_server.endpoint, "--control-table", store.table, "backfill", m.id,
                     "--segments", "1", "--metrics-port", str(port), "--metrics-addr", "127.0.0.1"])
    err = capsys.readouterr().err
    assert code == 2 and f"--metrics-port {port}: cannot listen there" in err and "Traceback" not in err


def test_a_processes_parent_serves_its_childrens_metrics_added_up(dynalite, dynalite_server, unique_name, capsys):
    """--processes 2: the children relay their budget beats and page events; the parent's EMF
    lines count both processes (the children's capacity added up, Processes = 2)."""
    m, store = table_of(dynalite, unique_name, 120)
    code = main(["--endpoint-url", dynalite_server.endpoint, "--control-table", store.table, "backfill", m.id,
                 "--segments", "4", "--processes", "2", "--page-size", "20", "--max-wcu", "200", "--metrics", "emf",
                 "--metrics-interval", "0.3"])
    out = capsys.readouterr().out
    assert code == 0, out
    docs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    last = docs[-1]
    assert last["Processes"] == 2 and last["WriteCapacityBudget"] == 200
    main_lines = [d for d in docs if "Reason" not in d]
    copied = sum(d.get("ItemsCopied", 0) for d in main_lines)
    consumed = sum(d.get("ConsumedWriteCapacityUnits", 0) for d in main_lines)
    assert copied > 0 and consumed >= copied  # both children's writes, one WCU at least per copy
