"""Every mistake in a migration file: one line naming the file and the key, exit status 2.

The same matrix runs twice: through :func:`reshard.core.migration.load` (the message) and
through the command line (exit status, exactly one line on stderr, no traceback).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from reshard.core import migration
from reshard.cli.main import main
from reshard.errors import MigrationFileError

ROOT = pathlib.Path(__file__).resolve().parents[2]

GOOD = """\
id = "sensor-events-16-to-32"
table = "SensorEvents"

[keys]
partition = "PK"
sort = "SK"

[from]
partition = "{sensor_id}#{shard}"
sort = "{ts}"
shards = 16
shard_by = ["event_id"]
hash = "sha256"

[to]
partition = "{sensor_id}#{shard}"
sort = "{ts}"
shards = 32
shard_by = ["event_id"]
hash = "sha256"

[cleanup]
ttl_attribute = "expires_at"
"""


def edit(old: str, new: str) -> str:
    assert GOOD.count(old) >= 1, old
    return GOOD.replace(old, new, 1)


def edit_to(old: str, new: str) -> str:
    """Replace in the [to] table only."""
    head, tail = GOOD.split("[to]")
    assert old in tail, old
    return head + "[to]" + tail.replace(old, new, 1)


# (case id, file text, the key the message must name, a fragment of the problem)
MISTAKES = [
    ("missing-table", edit('table = "SensorEvents"\n', ""), "table", "missing"),
    ("missing-from-shards", edit("shards = 16\n", ""), "from.shards", "missing"),
    ("missing-keys-table", edit('[keys]\npartition = "PK"\nsort = "SK"\n', ""), "keys", "missing"),
    ("unknown-top-key", "colour = 'blue'\n" + GOOD, "colour", "unknown key"),
    ("unknown-layout-key", edit("shards = 16\n", "shards = 16\nshard = 3\n"), "from.shard", "unknown key"),
    ("shards-zero", edit("shards = 16", "shards = 0"), "from.shards", "from 1 to"),
    ("shards-negative", edit_to("shards = 32", "shards = -4"), "to.shards", "from 1 to"),
    ("shards-absurd", edit_to("shards = 32", "shards = 1000000"), "to.shards", "from 1 to"),
    ("shards-not-int", edit_to("shards = 32", 'shards = "32"'), "to.shards", "integer"),
    ("from-equals-to", edit_to("shards = 32", "shards = 16"), "to", "identical"),
    ("template-without-shard", edit_to('partition = "{sensor_id}#{shard}"', 'partition = "{sensor_id}"'),
     "to.partition", "{shard}"),
    ("field-nobody-supplies", edit_to('partition = "{sensor_id}#{shard}"', 'partition = "{region}#{shard}"'),
     "to.partition", "no item can supply"),
    ("random-in-to", edit_to('shard_by = ["event_id"]\nhash = "sha256"', 'shard_by = "random"'),
     "to.shard_by", "random"),
    ("unknown-hash", edit('hash = "sha256"', 'hash = "crc32"'), "from.hash", "unknown hash"),
    ("unknown-hash-lists-jump", edit_to('hash = "sha256"', 'hash = "Jump"'), "to.hash", "known: sha256, md5, jump"),
    # A random [to] is refused for being random before anything else about it (issue 27: it
    # was "to.hash has no meaning" first, and "to.shards" over 99 shards).
    ("random-in-to-with-jump", edit_to('shard_by = ["event_id"]\nhash = "sha256"', 'shard_by = "random"\nhash = "jump"'),
     "to.shard_by", "\"random\" is refused in [to] (the new layout must be deterministic"),
    ("random-in-to-with-sha256", edit_to('shard_by = ["event_id"]', 'shard_by = "random"'),
     "to.shard_by", "\"random\" is refused in [to] (the new layout must be deterministic"),
    ("random-in-to-many-shards", edit_to('shard_by = ["event_id"]\nhash = "sha256"', 'shard_by = "random"').replace(
        "shards = 32", "shards = 200"), "to.shard_by", "must be deterministic"),
    # One field spelt two ways: blamed where the typo is when the file tells (issue 27: a typo
    # in [from] was reported on to.partition), both keys named when it cannot.
    ("typo-in-from-partition", edit('partition = "{sensor_id}#{shard}"', 'partition = "{sensr_id}#{shard}"'),
     "from.partition", "{sensr_id} here and {sensor_id} in to.partition look like one field spelt two ways"),
    ("typo-in-from-sort", edit('sort = "{ts}"', 'sort = "{tss}"'), "from.sort", "{tss} here and {ts} in to.sort"),
    ("typo-in-to-partition", edit_to('partition = "{sensor_id}#{shard}"', 'partition = "{sensr_id}#{shard}"'),
     "from.partition", "{sensor_id} here and {sensr_id} in to.partition"),
    ("typo-in-to-the-file-spells-twice", edit('shard_by = ["event_id"]', 'shard_by = ["sensor_id", "event_id"]').replace(
        '[to]\npartition = "{sensor_id}#{shard}"', '[to]\npartition = "{sensr_id}#{shard}"'),
     "to.partition", "did you mean {sensor_id}, as from.partition has it?"),
    ("to-shard-by-nobody-supplies", edit_to('shard_by = ["event_id"]', 'shard_by = ["evnt_id"]'), "to.shard_by",
     "{evnt_id} is in no [from] template"),
    ("derived-from-nothing", edit_to('shards = 32', 'shards = 32\nfields.hour = { from = "tz", format = "%H" }')
     .replace('sort = "{ts}"\nshards = 32', 'sort = "{hour}#{ts}"\nshards = 32'), "to.fields.hour.from", "'tz'"),
    ("shard-twice-sort", edit('sort = "{ts}"', 'sort = "{ts}#{shard}"'), "from.sort", "only once"),
    ("to-template-names-physical-key", edit_to('partition = "{sensor_id}#{shard}"', 'partition = "{PK}#{shard}"'),
     "to.partition", "physical key attribute"),
    ("random-from-too-many-shards", edit('shard_by = ["event_id"]\nhash = "sha256"', 'shard_by = "random"')
     .replace("shards = 16", "shards = 100"), "from.shards", "limited to 99"),
    ("random-from-with-hash", edit('shard_by = ["event_id"]', 'shard_by = "random"'), "from.hash", "no meaning"),
    ("index-random-in-to", GOOD + '\n[index.ByDay]\npartition = "GSI1PK"\nfrom = { partition = "{day}#{shard}", '
     'shards = 4, shard_by = ["event_id"] }\nto = { partition = "{day}#{shard}", shards = 8, shard_by = "random", '
     'hash = "md5" }\n', "index.ByDay.to.shard_by", "must be deterministic"),
    ("retain-hours-negative", GOOD + "retain_hours = -1\n", "cleanup.retain_hours", "from 0 to 8784"),
    ("ttl-is-a-key", edit('ttl_attribute = "expires_at"', 'ttl_attribute = "SK"'), "cleanup.ttl_attribute",
     "key attribute"),
    ("sort-same-as-partition", edit('sort = "SK"', 'sort = "PK"'), "keys.sort", "must differ"),
    ("jump-and-shard-function", edit_to('hash = "sha256"', 'hash = "jump"\nshard_function = "os.path:join"'),
     "to.shard_function", "not both"),
]


@pytest.mark.parametrize("text,key,problem", [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_mistake_message_names_file_and_key(tmp_path, text, key, problem):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(MigrationFileError) as info:
        migration.load(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}: {key}: "), msg
    assert problem in msg
    assert info.value.key == key


def test_toml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(edit("shards = 16", "shards = = 16"))
    line = edit("shards = 16", "shards = = 16").splitlines().index("shards = = 16") + 1
    with pytest.raises(MigrationFileError) as info:
        migration.load(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: TOML syntax error"), msg
    assert f"line {line}," in msg and "\n" not in msg


def test_missing_file(tmp_path):
    path = tmp_path / "nope.toml"
    with pytest.raises(MigrationFileError) as info:
        migration.load(path)
    assert str(info.value) == f"{path}: no such file"


def test_the_good_file_and_the_examples_are_valid():
    m = migration.parse(GOOD, "good.toml")
    assert (m.source.shards, m.target.shards) == (16, 32)
    for p in sorted((ROOT / "migrations").glob("*.toml")):
        migration.load(p)


# --------------------------------------------------------------------------- through the CLI

CLI_CASES = [(m[0], m[1], f": {m[2]}: ") for m in MISTAKES] + [
    ("toml-syntax", edit("shards = 16", "shards = = 16"), ": TOML syntax error"),
]


@pytest.mark.parametrize("text,fragment", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_plan_bad_file_exits_2_with_one_line(tmp_path, capsys, text, fragment):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    rc = main(["plan", str(path)])
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"reshard: error: {path}") and fragment in err
    assert "Traceback" not in err


def test_cli_plan_missing_file(tmp_path, capsys):
    rc = main(["plan", str(tmp_path / "nope.toml")])
    out, err = capsys.readouterr()
    assert rc == 2
    assert err == f"reshard: error: {tmp_path / 'nope.toml'}: no such file\n"


@pytest.mark.parametrize("case", ["random-in-to", "missing-file"])
def test_cli_subprocess_bad_file(tmp_path, case):
    path = tmp_path / "bad.toml"
    if case != "missing-file":
        path.write_text(dict((m[0], m[1]) for m in MISTAKES)[case])
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "reshard", "plan", str(path)], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert str(path) in proc.stderr and "Traceback" not in proc.stderr
