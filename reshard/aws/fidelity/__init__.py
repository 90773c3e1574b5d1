"""A DynamoDB-fidelity proxy: dynalite (or moto's server) behind a loopback proxy that does
what real DynamoDB does and local servers do not (issue 29), and the faults tests need.

Starting it
    In-process (threads of this process)::

        with FidelityProxy("http://127.0.0.1:8000", signature_window=300, seed=1) as proxy:
            dynamo = Dynamo(endpoint_url=proxy.endpoint)

    As a process (its CPU out of the caller's)::

        with FidelityProcess("http://127.0.0.1:8000", stale_reads=True) as proxy: ...

        python -m reshard.aws.fidelity --upstream http://127.0.0.1:8000 --port 0 \\
            [--signature-window 300] [--clock-offset 0] [--seed 0] [--config '{"ttl": true}']
        # prints its port, serves until SIGTERM/SIGINT

    Another process drives a running proxy with ``RemoteFidelity(endpoint)``. All three have
    the same calls (:class:`~reshard.aws.fidelity.proxy.ControlAPI`); over HTTP each is
    ``POST /_fidelity/<call>`` with a JSON object of its keyword arguments, answered
    ``{"result": ...}`` (400 ``{"error": ...}`` on bad arguments or a timeout).

The clock and the signature window
    The proxy's clock is real time + ``clock_offset`` (``configure(clock_offset=...)``,
    ``advance_clock(seconds)``, ``now()``); every answer's ``Date`` header is from it. A request
    whose ``X-Amz-Date`` is more than ``signature_window`` seconds (default 300; 0: off) before
    or after that clock *when it is delivered upstream* is refused: HTTP 400
    ``{"__type": "com.amazon.coral.service#InvalidSignatureException", "message": "Signature
    expired: <date> is now earlier than <now-W> (<now> - 5 min.)"}`` (or "Signature not yet
    current: ... is still later than ... (... + 5 min.)"), as AWS answers.

Faults (rules): each call returns a rule id; match arguments ``op``, ``table`` (a name or a
list), ``key`` (``{"PK": "a#1"}`` or wire values), ``contains`` (a substring of the body),
``nth`` (the n-th matching request, from 1), ``times`` (at most this many, default 1; None:
every one), ``probability``; in-process also ``where=callable(op, body)``.

    ``hold(delay=None, mode="wait"|"lose", age=0, **match)``: keep the request; deliver it
        after ``delay`` s or on ``release``. ``wait``: the client waits for that answer (until
        its own read timeout); ``lose``: its connection is closed at once (it retries).
        ``age``: on delivery, judge the signature as if held ``age`` s more.
    ``lose_answer(**match)``: deliver it, then close the connection without the answer.
    ``duplicate(copy="now"|"delay"|"hold", delay=None, age=0, **match)``: deliver it twice.
    ``fail(status=500, code="InternalServerError", message=..., **match)``: answer an error.
    ``rules()``, ``remove_rule(id)``, ``clear_rules()``.
    ``held(rule=None, state="held")``: held requests and copies as dicts (``handle``, ``op``,
        ``tables``, ``keys``, ``amz_date``, ``state``, ``outcome`` once delivered);
        ``wait_held(count=1, rule=None, timeout=10)``; ``release(handle)`` -> the delivery's
        outcome ``{"status", "code", "message", "body"}``; ``release_all(rule=None)``;
        ``drop(handle)`` (it never lands).

Behaviours, each a setting of ``configure`` (all off by default; see ``settings()``):
    ``stale_reads`` (``stale_window`` 1 s, ``stale_probability`` 0.5, ``gsi_lag`` 1 s,
    ``stale_inserts``), ``partition_throughput`` (``partition_wcu`` 1000, ``partition_rcu``
    3000, ``partition_burst_seconds`` 1, ``throttle_error``, ``partition_tables``),
    ``unprocessed_rate``, ``ttl`` (``ttl_delay`` 2 s, ``ttl_sweep_seconds`` 0.5,
    ``ttl_time_offset``; ``ttl_sweep()`` runs one sweep now); the chaos suite's
    ``faults_enabled`` / ``fault_rates`` ({"throttle", "5xx", "split"}) and ``blocked_tables``.
    ``stats()``: counters (requests, forwarded, refused_signature, rule_*, held, stale_reads,
    partition_throttles, throttle_reasons, unprocessed_items, ttl_deleted, ...) and the
    proxy's ``cpu_seconds``.
"""

from reshard.aws.fidelity.proxy import ControlAPI, FidelityProcess, FidelityProxy, RemoteFidelity

__all__ = ["ControlAPI", "FidelityProcess", "FidelityProxy", "RemoteFidelity"]
