"""`list`, `iam-policy`, `status` and the output formats as a new user meets them (issue 27 point 10).
Through the real ``main()`` against moto."""

from __future__ import annotations

import json
import re

import pytest

from reshard.cli import formats
from reshard.cli.main import main
from reshard.control.store import ControlStore
from reshard.core.migration import load, parse
from tests.functional.test_phase_cli import SENSOR_FILE, make_table

CT = ["--control-table", "listing-ctl"]
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00$")


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([*args, *CT])
    out, err = capsys.readouterr()
    return code, out, err


def test_list_without_a_control_table_is_an_empty_list(moto_dynamo, capsys):
    code, out, err = run(capsys, "list")
    assert (code, err) == (0, "")
    assert out.startswith("no migration: control table listing-ctl does not exist yet (`reshard start FILE` creates it")
    code, out, _ = run(capsys, "list", "--output", "json")
    assert code == 0 and json.loads(out) == {"control_table": "listing-ctl", "control_table_exists": False,
                                             "migrations": []}


def test_iam_policy_without_a_role_names_the_four(capsys):
    code, out, err = run(capsys, "iam-policy", SENSOR_FILE)
    assert code == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith("reshard: error: iam-policy needs --role, one of: app ")
    assert all(f"{role} (" in line for role in ("app", "observer", "worker", "operator"))
    code, out, _ = run(capsys, "iam-policy", SENSOR_FILE, "--role", "observer")
    assert code == 0 and json.loads(out)["Version"] == "2012-10-17"


def _second_migration(store: ControlStore, moto_dynamo) -> str:
    make_table(moto_dynamo, "Other")
    text = open(SENSOR_FILE).read().replace('id = "sensor-events-16-to-32"', 'id = "other-16-to-32"').replace(
        'table = "SensorEvents"', 'table = "Other"')
    store.register(parse(text, "other.toml"), who="bob@h2")
    return "other-16-to-32"


def test_status_with_several_active_migrations_lists_them_and_asks_for_one(moto_dynamo, capsys):
    make_table(moto_dynamo, "SensorEvents")
    store = ControlStore(moto_dynamo, CT[1])
    store.register(load(SENSOR_FILE), who="alice@h1")
    other = _second_migration(store, moto_dynamo)
    code, out, err = run(capsys, "status")
    assert code == 2
    rows = out.splitlines()
    assert rows[0].split()[:3] == ["ID", "TABLE", "PHASE"]
    assert [r.split()[:3] for r in rows[1:]] == [["sensor-events-16-to-32", "SensorEvents", "planned"],
                                                 [other, "Other", "planned"]]
    assert err == ("reshard: error: 2 active migrations in control table 'listing-ctl' (listed above): name one, "
                   "e.g. `reshard status sensor-events-16-to-32`\n")
    code, out, _ = run(capsys, "status", other)
    assert code == 0 and out.startswith(f"migration {other}  (table Other")
    # Other commands without MIGRATION: one line naming each with its table and phase.
    code, _, err = run(capsys, "advance")
    assert code == 2 and err.startswith("reshard: error: 2 active migrations: sensor-events-16-to-32 (table "
                                        "SensorEvents, planned), other-16-to-32 (table Other, planned); name one")


def test_json_times_are_iso_8601_and_text_is_aws_clis(moto_dynamo, capsys):
    make_table(moto_dynamo, "SensorEvents")
    assert run(capsys, "start", SENSOR_FILE)[0] == 0
    code, out, _ = run(capsys, "status", "--output", "json")
    doc = json.loads(out)
    assert ISO.match(doc["created_at"]) and all(ISO.match(h["at"]) for h in doc["history"]), doc
    code, out, _ = run(capsys, "list", "--output", "json")
    (m,) = json.loads(out)["migrations"]
    assert ISO.match(m["started"]) and m["finished"] is None
    # --query sees the ISO strings too (as aws-cli's JMESPath does).
    code, out, _ = run(capsys, "list", "--query", "migrations[0].started", "--output", "json")
    assert ISO.match(json.loads(out))
    # --output text without --query: aws-cli's text of the document, not the text for people.
    code, out, _ = run(capsys, "list", "--output", "text")
    lines = out.splitlines()
    assert lines[0] == "listing-ctl\tTrue"
    cells = lines[1].split("\t")
    assert cells[0] == "MIGRATIONS" and cells[1:4] == ["True", "None", "sensor-events-16-to-32"]
    # active, finished, id, phase, phase_version, retired, started, started_by, table
    assert ISO.match(cells[7]) and cells[-1] == "SensorEvents"
    code, people, _ = run(capsys, "list")
    assert people.startswith("ID ") and "\t" not in people  # without --output: the table for people


def test_aws_text_follows_aws_cli():
    doc = {"b": 1, "a": "x", "rows": [{"k": 1, "v": "p"}, {"k": 2, "w": True, "sub": [1, 2]}],
           "tags": ["t1", "t2"], "nested": {"z": None}}
    assert formats.aws_text(doc).splitlines() == [
        "x\t1",                           # the object's scalars, in key order
        "NESTED\tNone",
        "ROWS\t1\tp\t",                   # every row the same columns: k, v, w (missing: empty)
        "ROWS\t2\t\tTrue",
        "SUB\t1", "SUB\t2",
        "TAGS\tt1", "TAGS\tt2"]
    assert formats.aws_text([["a", "complete"], ["b", "aborted"]]) == "a\tcomplete\nb\taborted"
    assert formats.aws_text(["a", "b"]) == "a\tb" and formats.aws_text(3.0) == "3"


@pytest.mark.parametrize("t", [0, None])
def test_an_unset_time_is_null(t):
    assert formats.with_iso_times({"finished_at": t, "x": {"at": 1.5}}) == {
        "finished_at": None, "x": {"at": "1970-01-01T00:00:01.500000+00:00"}}
