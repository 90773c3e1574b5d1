"""The pure domain imports no AWS SDK, CLI, progress or retry library (STYLE.md)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOMAIN = ["reshard.errors", "reshard.core.migration", "reshard.core.layout", "reshard.core.phases", "reshard.core.versions",
          "reshard.core.planning"]
FORBIDDEN = ["boto3", "botocore", "click", "tqdm", "tenacity"]


def test_domain_modules_import_no_infrastructure():
    code = (
        "import importlib, json, sys\n"
        f"for m in {DOMAIN!r}: importlib.import_module(m)\n"
        f"print(json.dumps([m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}]))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                          cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def test_the_check_would_see_a_forbidden_import():
    """The same probe does report boto3 when a module pulls it in (the check can fail)."""
    code = f"import sys, json, reshard.aws.dynamo; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({FORBIDDEN!r}))))"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "boto3" in json.loads(proc.stdout)
