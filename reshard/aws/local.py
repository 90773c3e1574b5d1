"""An embedded local DynamoDB for `reshard demo` and quick tries: no AWS account needed.

It is moto's threaded server (``pip install 'reshard[demo]'`` brings it) listening on
a free 127.0.0.1 port. Fine for a few thousand items; for bigger local runs point
``--endpoint-url`` at a DynamoDB-compatible server such as dynalite or DynamoDB Local.
"""

from __future__ import annotations

import logging
import socket

from reshard import errors


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedDynamoDB:
    """moto's server in a background thread; use as a context manager."""

    def __init__(self, port: int | None = None):
        self.port = port or _free_port()
        self._server = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> str:
        try:
            from moto.server import ThreadedMotoServer
        except ImportError:
            raise errors.BadInput("the embedded DynamoDB needs moto's server: "
                                  "python3 -m pip install -e '.[demo]' (or pass --endpoint-url)") from None
        # werkzeug logs every request to stderr by default: the demo's output would drown.
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        return self.endpoint_url

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> "EmbeddedDynamoDB":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
