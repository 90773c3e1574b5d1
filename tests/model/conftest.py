"""Markers for tests/model: the root conftest marks tests by folder (unit, functional,
integration, reliability) and setup.cfg declares only those, with --strict-markers. Until
a ``model`` marker is declared there, tests here are marked ``integration`` when they use
dynalite (the conformance suite) and ``unit`` otherwise (pure in-memory).
"""

from __future__ import annotations

import pathlib

import pytest

HERE = pathlib.Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = pathlib.Path(str(item.fspath)).resolve()
        if HERE not in path.parents:
            continue
        if "dynalite" in getattr(item, "fixturenames", ()) or "dynalite_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)
        else:
            item.add_marker(pytest.mark.unit)



@pytest.fixture(autouse=True)
def gates_on_the_logical_clock(monkeypatch):
    """Cutover's, retire's and the abort's cleanup's wait for job leases run on the current
    World's logical clock when an actor calls them (see ``explore.logical_gates``)."""
    from tests.model.explore import logical_gates
    logical_gates(monkeypatch)
