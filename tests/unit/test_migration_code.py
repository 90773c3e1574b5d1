"""What a migration file can make reshard run or allocate (issue 30, cases 6 and 8).

* ``shard_function`` is imported only where it is called (a key computed), never when a file
  is parsed (``iam-policy``, ``plan``'s checks, ``status FILE``, a shim's constructor), and
  only from the application's own modules: next to the migration file (or in its project
  directory), or a package the deployment declares in ``$RESHARD_SHARD_FUNCTION_PACKAGES``.
  ``shutil:rmtree`` and other standard-library callables are refused.
* A ``{shard:...}`` format spec pads at most 32 characters: ``{shard:300000000}`` passed the
  old check (``format(7, spec)``) and allocated 300 MB per key formatted.
"""

from __future__ import annotations

import sys

import pytest

from reshard.cli.main import main
from reshard.core import migration
from reshard.core.layout import KeyMapper
from reshard.core.wire import S
from reshard.errors import MigrationFileError

from tests.unit.test_migration_errors import edit_to

pytestmark = pytest.mark.unit

MODULE = '''
import pathlib
pathlib.Path({marker!r}).write_text("imported")

def shard(key, shards):
    return len(key) % shards
'''


def with_function(tmp_path, module: str, spec: str, *, folder: str = "") -> tuple:
    """A migration file (in ``tmp_path/folder``) whose [to] uses ``spec``; the module written as
    ``tmp_path/<module>.py``; the marker file its import creates."""
    marker = tmp_path / f"imported-{module}"
    (tmp_path / f"{module}.py").write_text(MODULE.format(marker=str(marker)))
    where = tmp_path / folder if folder else tmp_path
    where.mkdir(exist_ok=True)
    path = where / "m.toml"
    path.write_text(edit_to('hash = "sha256"', f'shard_function = "{spec}"'))
    return path, marker


@pytest.fixture(autouse=True)
def _forget_modules():
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        sys.modules.pop(name, None)


@pytest.mark.parametrize("spec", ["shutil:rmtree", "os:system", "subprocess:call", "reshard.core.layout:hash_shard",
                                  "builtins:exec"])
def test_a_standard_library_or_reshard_callable_is_refused_in_one_line(tmp_path, spec):
    path = tmp_path / "m.toml"
    path.write_text(edit_to('hash = "sha256"', f'shard_function = "{spec}"'))
    with pytest.raises(MigrationFileError) as e:
        migration.load(path)
    assert str(e.value).startswith(f"{path}: to.shard_function: ") and "standard library" in str(e.value)
    assert main(["iam-policy", str(path), "--role", "app"]) == 2


def test_a_module_that_is_not_the_applications_is_refused(tmp_path, monkeypatch):
    # Installed (importable), but neither next to the file nor declared: refused, not imported.
    path = tmp_path / "m.toml"
    path.write_text(edit_to('hash = "sha256"', 'shard_function = "pytest:main"'))
    with pytest.raises(MigrationFileError, match="RESHARD_SHARD_FUNCTION_PACKAGES"):
        migration.load(path)
    # Declared by the deployment: allowed.
    monkeypatch.setenv("RESHARD_SHARD_FUNCTION_PACKAGES", "somepkg, pytest")
    assert migration.load(path).target.shard_function == "pytest:main"


@pytest.mark.parametrize("folder", ["", "migrations"])
def test_parsing_runs_no_code_the_first_key_imports_the_module(tmp_path, folder):
    path, marker = with_function(tmp_path, "myshards", "myshards:shard", folder=folder)
    m = migration.load(path)
    mapper = KeyMapper(m)  # what a shim builds in its constructor
    assert main(["iam-policy", str(path), "--role", "app"]) == 0
    assert not marker.exists(), "parsing the file (or building its layouts) ran the module"
    key = mapper.new.key({"sensor_id": S("s-1"), "event_id": S("e-12345"), "ts": S("t")})
    assert marker.exists() and key["PK"]["S"] == f"s-1#{len('e-12345') % 32}"


def test_a_callable_imported_into_the_module_is_refused_when_loaded(tmp_path):
    (tmp_path / "sneaky.py").write_text("from shutil import rmtree\n")
    path = tmp_path / "m.toml"
    path.write_text(edit_to('hash = "sha256"', 'shard_function = "sneaky:rmtree"'))
    m = migration.load(path)  # the module is the application's: parsing accepts it, runs nothing
    with pytest.raises(MigrationFileError, match="imported into 'sneaky'"):
        KeyMapper(m).new.key({"sensor_id": S("s-1"), "event_id": S("e-1"), "ts": S("t")})


def test_a_registered_file_is_read_on_a_host_without_the_module(tmp_path):
    # What the control table holds: readable anywhere (status, advance); the function is checked
    # where it is loaded, against the path `start` registered the file from.
    path, marker = with_function(tmp_path, "regshards", "regshards:shard")
    text = path.read_text()
    m = migration.parse(text, "control-table:x", origin="/nowhere/m.toml")
    with pytest.raises(MigrationFileError, match="neither next to the migration file"):
        KeyMapper(m).new.key({"sensor_id": S("s-1"), "event_id": S("e-1"), "ts": S("t")})
    m = migration.parse(text, "control-table:x", origin=str(path))
    assert KeyMapper(m).new.key({"sensor_id": S("s-1"), "event_id": S("e-1"), "ts": S("t")})
    assert marker.exists()


@pytest.mark.parametrize("spec, ok", [("02d", True), ("03", True), (">4", True), ("x", True), ("0>32d", True),
                                      ("300000000", False), ("033", False), ("0>999999d", False), ("5f", False),
                                      ("%", False)])
def test_a_format_spec_pads_at_most_32_characters(tmp_path, spec, ok):
    text = edit_to('partition = "{sensor_id}#{shard}"', f'partition = "{{sensor_id}}#{{shard:{spec}}}"')
    if ok:
        migration.parse(text, "m.toml")
        return
    with pytest.raises(MigrationFileError) as e:
        migration.parse(text, "m.toml")
    assert str(e.value).startswith("m.toml: to.partition: ") and "\n" not in str(e.value)
