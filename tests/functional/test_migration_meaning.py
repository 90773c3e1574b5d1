"""The migration file identified by its meaning, end to end on moto (issue 27 point 6).

An app keeps its migration file for years; a reformat in the app's repository (comments,
whitespace, key order, quoting) must not take production down at the next deploy. Shims with
the edited file keep serving and ``start`` says "nothing changed"; a change of meaning under
the same id stays refused by both, naming what changed. Rows registered before the meaning
hash existed (``file_hash`` of the bytes only) are still recognised.
"""

from __future__ import annotations

import pathlib

import pytest

from reshard.cli.main import main
from reshard.control.store import ControlStore
from reshard.core.migration import parse
from reshard.control.records import META
from reshard.shim import errors as shim_errors
from reshard.shim.table import ShardedTable
from tests.functional.test_phase_cli import make_table

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEXT = (ROOT / "migrations" / "0001_sensor_events.toml").read_text()
MID = "sensor-events-16-to-32"
CT = ["--control-table", "meaning-ctl"]

#: The same migration written otherwise: other comments, blank lines, key order, quoting,
#: an inline table, dotted keys, an explicit default and another description.
REFORMATTED = '''\
# Reformatted in the app's repository: same migration.
table='SensorEvents'
id   =   "sensor-events-16-to-32"
description = """Another description"""
keys = { sort = 'SK', partition = "PK" }

[to]
shard_by = 'event_id'
shards = 0x20          # 32
partition = '{sensor_id}#{shard}'
sort = "{ts}"

[from]
"partition" = "{sensor_id}#{shard}"
sort = '{ts}'
shards = 16
shard_by = ["event_id",]
hash = "sha256"

[cleanup]
retain_hours = 168.0
ttl_attribute = "expires_at"
'''

CHANGED = TEXT.replace("shards = 32", "shards = 64")


def write(tmp_path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([*args, *CT])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def aws(moto_dynamo):
    make_table(moto_dynamo, "SensorEvents")
    return moto_dynamo


def test_the_reformatted_file_parses_to_the_same_meaning():
    assert parse(REFORMATTED).meaning_hash == parse(TEXT).meaning_hash
    assert parse(REFORMATTED).content_hash != parse(TEXT).content_hash


def test_start_says_nothing_changed_for_a_reformatted_file_and_names_a_change_of_meaning(aws, capsys, tmp_path):
    assert run(capsys, "start", write(tmp_path, "a.toml", TEXT))[0] == 0
    code, out, err = run(capsys, "start", write(tmp_path, "b.toml", REFORMATTED))
    assert code == 0, err
    assert "already registered with a file of the same meaning" in out and "nothing changed" in out
    code, out, err = run(capsys, "start", write(tmp_path, "c.toml", CHANGED))
    assert code == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"reshard: error: migration '{MID}' is already registered with a different meaning: "
                           "to.shards: 32 -> 64. ")
    assert "give the changed file a new id" in line
    store = ControlStore(aws, CT[1])
    assert store.load_state(MID).file_text == TEXT  # the registered text stays


def _shim(aws, text: str, tmp_path, name: str) -> ShardedTable:
    return ShardedTable.from_file(write(tmp_path, name, text), dynamo=aws, control_table=CT[1],
                                  refresh_seconds=3600)


def _serves(t: ShardedTable) -> None:
    item = {"sensor_id": "s-1", "event_id": "e-1", "ts": "2024-10-27T15:00:00Z", "temp": 1}
    t.put_item(Item=item)
    assert t.get_item(Key={k: item[k] for k in ("sensor_id", "event_id", "ts")}, ConsistentRead=True)["Item"]


def _drop_meaning_hash(store: ControlStore) -> None:
    """Make the row look registered by an earlier release: the byte hash only."""
    store.update(store.mpk(MID), META, "REMOVE meaning_hash")
    assert "meaning_hash" not in store.load_state(MID).raw


@pytest.mark.parametrize("old_row", [False, True], ids=["row-with-meaning-hash", "row-of-an-earlier-release"])
def test_a_shim_with_the_reformatted_file_keeps_serving_and_one_of_another_meaning_refuses(aws, tmp_path, old_row):
    store = ControlStore(aws, CT[1])
    store.register(parse(TEXT, "registered.toml"), who="test")
    if old_row:
        _drop_meaning_hash(store)
    with _shim(aws, TEXT, tmp_path, "same.toml") as t:  # the same bytes: recognised at once
        assert t.phase == "planned"
        _serves(t)
    with _shim(aws, REFORMATTED, tmp_path, "reformatted.toml") as t:
        assert t.phase == "planned"
        _serves(t)
    with _shim(aws, CHANGED, tmp_path, "changed.toml") as t:
        with pytest.raises(shim_errors.ShimUnavailable) as e:
            _serves(t)
        assert "registered with a file of another meaning than the one this shim loaded (to.shards: 32 -> 64)" \
            in str(e.value)


def test_start_on_a_row_of_an_earlier_release(aws, capsys, tmp_path):
    assert run(capsys, "start", write(tmp_path, "a.toml", TEXT))[0] == 0
    _drop_meaning_hash(ControlStore(aws, CT[1]))
    assert "already registered with this file" in run(capsys, "start", write(tmp_path, "a2.toml", TEXT))[1]
    code, out, _ = run(capsys, "start", write(tmp_path, "b.toml", REFORMATTED))
    assert code == 0 and "same meaning" in out
    code, _, err = run(capsys, "start", write(tmp_path, "c.toml", CHANGED))
    assert code == 2 and "to.shards: 32 -> 64" in err
