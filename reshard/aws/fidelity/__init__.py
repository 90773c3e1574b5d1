"""A DynamoDB-fidelity proxy: dynalite (or moto's server) behind a loopback proxy that does
what real DynamoDB does and local servers do not (issue 29), and the faults tests need.

Start it in-process (threads) or as a process::

    from reshard.aws.fidelity import FidelityProxy, FidelityProcess
    with FidelityProxy(dynalite.endpoint, signature_window=300) as proxy:   # or FidelityProcess(...)
        client = Dynamo(endpoint_url=proxy.endpoint)
        rule = proxy.hold(op="PutItem", table="T", mode="lose")   # the next PutItem of T is held
        ...
        h, = proxy.wait_held(1, rule)
        proxy.advance_clock(301)                                 # the proxy's clock moves on
        proxy.release(h["handle"])   # -> {"status": 400, "code": "InvalidSignatureException", ...}

    python -m reshard.aws.fidelity --upstream http://127.0.0.1:8000 --port 0   # prints its port

Both offer the same control API (:class:`~reshard.aws.fidelity.proxy.ControlAPI`);
a process is driven over HTTP under ``/_fidelity/<call>`` (JSON body of keyword arguments,
answer ``{"result": ...}``), also from another process with :class:`RemoteFidelity`.
"""

from reshard.aws.fidelity.proxy import ControlAPI, FidelityProcess, FidelityProxy, RemoteFidelity

__all__ = ["ControlAPI", "FidelityProcess", "FidelityProxy", "RemoteFidelity"]
