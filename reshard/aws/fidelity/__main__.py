"""``python -m reshard.aws.fidelity --upstream http://127.0.0.1:P --port 0``: the proxy as a process.

Prints the port it listens on (one line), then serves until SIGTERM/SIGINT, or until its
stdin closes with ``--exit-with-stdin`` (a parent that starts it this way never leaves it behind).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

from reshard.aws.fidelity.proxy import FidelityProxy


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reshard.aws.fidelity",
                                 description="A DynamoDB-fidelity proxy in front of dynalite or moto's server "
                                             "(loopback only); control API under /_fidelity/.")
    ap.add_argument("--upstream", required=True, help="the local server's endpoint, http://127.0.0.1:PORT")
    ap.add_argument("--port", type=int, default=0, help="port to listen on (0: any free one; printed)")
    ap.add_argument("--host", default="127.0.0.1", help="loopback address to listen on")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random faults and stale reads")
    ap.add_argument("--signature-window", type=float, default=None, help="seconds (default 300; 0: off)")
    ap.add_argument("--clock-offset", type=float, default=None, help="the proxy's clock minus real time, seconds")
    ap.add_argument("--config", default=None, help="more settings as a JSON object (see `settings`)")
    ap.add_argument("--exit-with-stdin", action="store_true", help="exit when stdin closes (a child process)")
    args = ap.parse_args(argv)
    settings = json.loads(args.config) if args.config else {}
    if args.signature_window is not None:
        settings["signature_window"] = args.signature_window
    if args.clock_offset is not None:
        settings["clock_offset"] = args.clock_offset
    try:
        proxy = FidelityProxy(args.upstream, port=args.port, host=args.host, seed=args.seed, **settings)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(proxy.port, flush=True)
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: proxy._stopped.set())
    if args.exit_with_stdin:
        def watch():
            try:
                while os.read(sys.stdin.fileno(), 4096):
                    pass
            except OSError:
                pass
            proxy._stopped.set()
        threading.Thread(target=watch, name="fidelity-stdin", daemon=True).start()
    proxy.start()
    proxy._stopped.wait()
    proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
