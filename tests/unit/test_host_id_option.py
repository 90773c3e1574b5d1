"""`--host-id` names this process in the run's budget row on every data job, as on backfill."""

from __future__ import annotations

import pytest

import reshard.cli.verify as cli_verify
from reshard.cli.main import main
from reshard.cli.options import Env


@pytest.mark.parametrize("argv", [["verify", "m-1"], ["cleanup", "m-1"], ["cleanup", "m-1", "--strip-bookkeeping"]])
def test_verify_and_cleanup_take_the_host_id_into_the_jobs_options(monkeypatch, argv):
    seen = []

    class Stop(Exception):
        pass

    def capture(*args):
        seen.append(args[-1])  # the JobOptions
        raise Stop

    monkeypatch.setattr(Env, "migration_id", lambda self, ref: ref)
    monkeypatch.setattr(cli_verify, "_run_job", capture)
    monkeypatch.setattr(cli_verify, "_strip", capture)
    monkeypatch.setenv("RESHARD_HOST_ID", "from-env")
    main([*argv, "--host-id", "pod-3", "--processes", "1"])  # stops at the job (an internal error: 1)
    main([*argv, "--processes", "1"])  # the environment variable, as on backfill
    assert [o.host_id for o in seen] == ["pod-3", "from-env"]
