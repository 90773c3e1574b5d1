"""Issue 25 (late writes), shim side: a migration on dynalite behind the fidelity proxy, moved
through its phases by the control store, with the server's clock moved by the proxy.

The proxy (``reshard.aws.fidelity``) refuses a request whose SigV4 date is more than the window
(300 s) before its clock, and dates every answer with that clock: a test moves the server's clock
past a request horizon with ``advance_clock`` instead of waiting for it. :meth:`Run.move` does what
the operator's transitions do (a compare-and-set of the phase, then the phase lasts ``H + 2`` s of
server time before anything moves again), directly on the control row, so a test can leave a
frozen shim behind without a census waiting for it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

from reshard.aws.dynamo import Dynamo, RetryPolicy, to_wire
from reshard.control.records import META
from reshard.control.store import ControlStore
from reshard.core.layout import KeyMapper
from reshard.core.migration import Migration
from reshard.core.phases import Phase
from reshard.shim.table import ShardedTable
from tests.backfill_support import setup_migration

#: The request horizon of these tests' migrations (seconds of server time).
H = 6.0
RETRY = RetryPolicy(max_attempts=4, max_seconds=30.0, base_seconds=0.01, max_backoff_seconds=0.05)


def client(endpoint: str, read_timeout: float = 4.0) -> Dynamo:
    return Dynamo(endpoint_url=endpoint, region="us-east-1", retry=RETRY, connect_timeout=1,
                  read_timeout=read_timeout)


def plain(key: dict) -> dict:
    """A physical key as the proxy's rules take it (``{"PK": "s-1#5", "SK": "..."}``)."""
    return {k: v["S"] for k, v in key.items()}


@dataclass
class Run:
    proxy: Any
    dynamo: Dynamo
    migration: Migration
    mapper: KeyMapper
    store: ControlStore
    control: str

    @classmethod
    def start(cls, proxy, name: str, kind: str = "sensor") -> "Run":
        """A migration in ``backfill`` (registered and advanced by the control store), H = :data:`H`."""
        dynamo = client(proxy.endpoint)
        ctl = f"{name}-ctl"
        m, mapper, store = setup_migration(dynamo, kind, name, control=ctl)
        store.update(store.mpk(m.id), META, "SET request_horizon = :h", values={":h": {"N": str(H)}})
        return cls(proxy, dynamo, m, mapper, store, ctl)

    def shim(self, read_timeout: float = 4.0, **kwargs) -> ShardedTable:
        return ShardedTable(self.migration, client(self.proxy.endpoint, read_timeout), control_table=self.control,
                            refresh_seconds=kwargs.pop("refresh_seconds", 3600), **kwargs)

    def move(self, target: str, *, switching: bool = False, newer_may_be: str | None = None,
             wait: bool = True) -> None:
        """A compare-and-set of the phase (and of ``newer_may_be``), then ``H + 2`` s of the
        server's clock: what every transition waits before the next (docs/late-writes.md, 2)."""
        state = self.store.load_state(self.migration.id)
        self.store.set_phase(state, Phase(target), "test", "test", switching=switching)
        if newer_may_be:
            self.store.update(self.store.mpk(self.migration.id), META, "SET newer_may_be = :n",
                              values={":n": {"S": newer_may_be}})
        else:
            self.store.update(self.store.mpk(self.migration.id), META, "REMOVE newer_may_be")
        if wait:
            self.proxy.advance_clock(H + 2)

    def switch(self, target: str, newer_may_be: str | None) -> None:
        """An authority switch: ``switching``, then the new phase with the catch-up flag."""
        self.move(target, switching=True)
        self.move(target, newer_may_be=newer_may_be)

    # -- items
    def moving(self, index: int = 0, **extra) -> dict:
        """A logical item whose old and new physical keys differ (the ``index``-th such)."""
        found = 0
        for i in range(1000):
            item = {"sensor_id": "s-1", "event_id": f"e-{i}", "ts": f"2024-10-27T15:00:{i % 60:02d}.{i:04d}Z"}
            fields = self.mapper.logical_fields(to_wire(item))
            if self.mapper.old.key(fields) != self.mapper.new.key(fields):
                if found == index:
                    return {**item, **extra}
                found += 1
        raise AssertionError("no moving item")

    def keys(self, item: dict) -> tuple[dict, dict]:
        """(old key, new key) of a logical item."""
        fields = self.mapper.logical_fields(to_wire(item))
        return self.mapper.old.key(fields), self.mapper.new.key(fields)

    def stored(self, key: dict) -> dict | None:
        """What the table holds at a physical key now (consistent)."""
        return self.dynamo.call("get_item", TableName=self.migration.table, Key=key, ConsistentRead=True).get("Item")


def key_of(item: dict) -> dict:
    return {k: item[k] for k in ("sensor_id", "event_id", "ts")}


class Background:
    """Run ``fn`` in a thread; ``result()`` waits and returns its value or raises its exception."""

    def __init__(self, fn: Callable[[], Any]):
        self._out: dict = {}

        def run():
            try:
                self._out["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the test
                self._out["error"] = e
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def result(self, timeout: float = 60.0) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the background call did not finish"
        if "error" in self._out:
            raise self._out["error"]
        return self._out.get("value")
