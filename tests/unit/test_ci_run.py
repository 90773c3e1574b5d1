""".ci/run, run against stand-ins for python3 and npm (nothing is installed): it rebuilds its
virtualenv each time, installs and tests with that virtualenv's Python under constraints.txt,
and fails when pytest does, exit 5 (no test collected) included."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# A python3 that logs how it was called; `-m venv DIR` makes a virtualenv of itself (an
# activate script that puts DIR/bin first on PATH), `-m pytest` exits with $STUB_PYTEST_EXIT.
STUB_PYTHON = textwrap.dedent("""\
    #!/usr/bin/env bash
    echo "$0 $* PIP_CONSTRAINT=${PIP_CONSTRAINT:-}" >> "$STUB_LOG"
    case "$1 $2" in
      "-m venv")
        dir="${@: -1}"
        [ -e "$dir" ] && echo "venv over an existing $dir" >> "$STUB_LOG"
        mkdir -p "$dir/bin"
        echo "export VIRTUAL_ENV=\\"$PWD/$dir\\"; export PATH=\\"$PWD/$dir/bin:\\$PATH\\"" > "$dir/bin/activate"
        cp "$0" "$dir/bin/python3" ;;
      "-m pip") exit "${STUB_PIP_EXIT:-0}" ;;
      "-m pytest") exit "${STUB_PYTEST_EXIT:-0}" ;;
    esac
    """)
STUB_NPM = '#!/usr/bin/env bash\necho "npm $*" >> "$STUB_LOG"\n'


@pytest.fixture
def ci(tmp_path):
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", repo / ".ci" / "run")
    (repo / "constraints.txt").write_text("")
    stale = repo / ".ci" / ".venv" / "lib" / "left-by-the-last-run"
    stale.parent.mkdir(parents=True)
    stale.write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("python3", STUB_PYTHON), ("npm", STUB_NPM)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "log"

    def run(**env) -> tuple[int, list[str]]:
        log.write_text("")
        full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(log), **env}
        for var in ("VIRTUAL_ENV", "PIP_CONSTRAINT"):  # set when this test runs under .ci/run itself
            full.pop(var, None)
        done = subprocess.run(["bash", str(repo / ".ci" / "run")], env=full, capture_output=True, text=True,
                              timeout=60)
        return done.returncode, log.read_text().splitlines()

    run.repo, run.stale = repo, stale
    return run


def test_a_fresh_virtualenv_runs_the_install_and_the_tests(ci):
    code, log = ci()
    assert code == 0, log
    venv_python = str(ci.repo / ".ci" / ".venv" / "bin" / "python3")
    constraint = f"PIP_CONSTRAINT={ci.repo / 'constraints.txt'}"
    assert log[0].endswith("python3 -m venv .ci/.venv PIP_CONSTRAINT=")   # the machine's python3 makes it
    assert not ci.stale.exists() and not any("over an existing" in line for line in log)  # rebuilt, not reused
    assert log[1:] == [f"{venv_python} -m pip install -q -e .[test] {constraint}",
                       "npm ci --no-audit --no-fund",
                       f"{venv_python} -m pytest {constraint}"]


@pytest.mark.parametrize("status", [5, 1, 2])
def test_pytest_failing_or_collecting_nothing_fails_ci(ci, status):
    code, _ = ci(STUB_PYTEST_EXIT=str(status))
    assert code == status


def test_a_failed_install_fails_ci_before_the_tests(ci):
    code, log = ci(STUB_PIP_EXIT="1")
    assert code == 1 and not any(" -m pytest" in line for line in log)
