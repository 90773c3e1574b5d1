"""DynamoDB's behaviours that dynalite lacks, each on its own switch (issue 29's step 2 fills this in)."""

from __future__ import annotations


class Behaviours:
    """What happens between the signature check and upstream: none yet (requests pass through)."""

    def __init__(self, proxy):
        self.proxy = proxy

    def defaults(self) -> dict:
        return {}

    def configure(self, settings: dict) -> None:
        pass

    def settings(self) -> dict:
        return {}

    def stats(self) -> dict:
        return {}

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def deliver(self, req):
        return self.proxy.forward(req)
