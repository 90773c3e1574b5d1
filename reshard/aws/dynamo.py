"""The one choke point through which reshard talks to DynamoDB.

Every AWS call in reshard goes through :meth:`Dynamo.call`, which

* retries throttling (``ProvisionedThroughputExceededException``,
  ``ThrottlingException``, ``RequestLimitExceeded``), 5xx answers, timeouts and
  dropped connections with exponential backoff and full jitter (tenacity); botocore's
  own retries are switched off so there is exactly one retry policy to reason about;
* translates ``ClientError`` into reshard's own exceptions carrying the AWS error
  code and request id (:mod:`reshard.errors`);
* reports consumed capacity and throttles to listeners (the backfill's budget).

It also offers the loops DynamoDB leaves to clients: ``UnprocessedItems`` and
``UnprocessedKeys`` are re-sent until done, with backoff.
"""

from __future__ import annotations

import os
import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import boto3
import botocore.config
import botocore.exceptions
from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential
from tenacity.stop import stop_base

from reshard import errors
from reshard.aws import signing
from reshard.aws.lean import UnreadableAnswer, lean_sender
from reshard.core.deadlines import parse_http_date, sign_epoch

#: Error codes that mean "slow down": retried, and reported to throttle listeners.
THROTTLE_CODES = frozenset({
    "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
})
#: Error codes that mean "the service had a bad moment": retried.
TRANSIENT_CODES = frozenset({
    "InternalServerError", "InternalFailure", "ServiceUnavailable", "InternalServerErrorException",
})
_NETWORK_ERRORS = (
    botocore.exceptions.ConnectionError,  # includes EndpointConnectionError
    botocore.exceptions.ConnectionClosedError,  # an HTTPClientError, not a ConnectionError
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectTimeoutError,
    UnreadableAnswer,  # the lean path's: no DynamoDB answer (a proxy's junk, a cut body): like a dropped one
)

#: What botocore's response parsing raises on an answer of the wrong shape (not a hook's own
#: exception: tests stop actors with classes of their own, which pass through unchanged).
_PARSER_ERRORS = (AttributeError, TypeError, ValueError, KeyError, IndexError)

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def to_wire(item: dict) -> dict:
    """boto3 resource values (str, Decimal, bytes, sets, lists, maps) -> wire format."""
    return {k: _serializer.serialize(v) for k, v in item.items()}


def from_wire(item: dict) -> dict:
    """Wire format -> boto3 resource values."""
    return {k: _deserializer.deserialize(v) for k, v in item.items()}


@dataclass
class RetryPolicy:
    """How hard a caller insists. The shim (request path) gives up sooner than a backfill."""

    max_attempts: int = 10
    max_seconds: float = 120.0
    base_seconds: float = 0.05
    max_backoff_seconds: float = 5.0


#: Every request's connect and read timeouts are bounded (botocore's own read timeout is
#: 60 s): a request that was sent either answers, or is given up, within one attempt's
#: bound -- the basis of the jobs' time fence (:attr:`Dynamo.attempt_seconds`).
CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 30.0

SHIM_RETRIES = RetryPolicy(max_attempts=6, max_seconds=10.0, base_seconds=0.025, max_backoff_seconds=1.0)

#: botocore's attempts when a client's config names none: legacy mode's DynamoDB entry of its
#: ``_retry.json`` (10), standard and adaptive mode's default (3).
_BOTOCORE_ATTEMPTS = {"legacy": 10, "standard": 3, "adaptive": 3}
#: botocore's backoff per mode: legacy DynamoDB ``0.05 * 2**(n-1)``; standard ``rand * 2**(n-1)``,
#: at most 20 s (``botocore.retries.standard.ExponentialBackoff``).
_BOTOCORE_BACKOFF = {"legacy": (0.05, 0.05 * 2 ** 9), "standard": (1.0, 20.0), "adaptive": (1.0, 20.0)}


def client_retry_policy(client) -> RetryPolicy:
    """The retries a botocore client's config asks for, as a :class:`RetryPolicy`: its total
    attempts (``retries={"total_max_attempts"|"max_attempts": ...}``, ``AWS_MAX_ATTEMPTS``, or its
    mode's default) and its mode's backoff. botocore has no total time cap: none here either."""
    retries = getattr(getattr(getattr(client, "meta", None), "config", None), "retries", None) or {}
    mode = retries.get("mode") or "legacy"
    attempts = retries.get("total_max_attempts")
    if attempts is None and retries.get("max_attempts") is not None:
        attempts = retries["max_attempts"] + 1  # botocore's max_attempts counts retries
    if attempts is None:
        attempts = _BOTOCORE_ATTEMPTS.get(mode, 3)
    base, most = _BOTOCORE_BACKOFF.get(mode, _BOTOCORE_BACKOFF["standard"])
    return RetryPolicy(max_attempts=max(1, int(attempts)), max_seconds=float("inf"), base_seconds=base,
                       max_backoff_seconds=most)


def retries_in_client(client) -> bool:
    """Whether botocore itself retries this client's requests (an application's client: its
    own retry configuration), as opposed to reshard's clients (``total_max_attempts`` 1)."""
    return client_retry_policy(client).max_attempts > 1

#: Attempts a command makes at an endpoint it was given (--endpoint-url, AWS_ENDPOINT_URL[_DYNAMODB])
#: that refuses the connection before anything ever answered there (nothing listens: a typo, a
#: server not started): a few quick tries, then one line and exit 2, instead of the whole retry
#: policy (~9 s of backoff). Once the endpoint has answered, a refused connection is a failure
#: like any other (a restarting server) and gets the whole policy.
FIRST_CONTACT_ATTEMPTS = 3

#: Endpoints that answered this process at least once (an HTTP answer, an error answer too).
_answered: set[str] = set()

#: Where the region comes from, in aws-cli v2's order (botocore itself reads no AWS_REGION).
REGION_HELP = "use --region, AWS_REGION or AWS_DEFAULT_REGION, or a profile with a region"


@dataclass
class CallStats:
    """Counts of what went through the choke point (for status, tests and benchmarks)."""

    calls: dict = field(default_factory=dict)
    retries: dict = field(default_factory=dict)
    throttles: int = 0
    #: Throttles by why: DynamoDB's ThrottlingReasons (e.g. TableWriteKeyRangeThroughputExceeded)
    #: when it says, else the error code; UnprocessedItems/UnprocessedKeys for a batch's leftovers.
    throttle_reasons: dict = field(default_factory=dict)
    consumed: dict = field(default_factory=dict)  # table -> capacity units

    def add(self, bucket: dict, key: str, n: float = 1) -> None:
        bucket[key] = bucket.get(key, 0) + n


def _retry_metadata(outcome, attempts: int, gave_up: bool) -> None:
    """``ResponseMetadata`` as botocore reports a call it retried itself: ``RetryAttempts`` the
    attempts after the first, ``MaxAttemptsReached`` only on a retryable failure that used them
    all. (reshard's own clients run botocore at one attempt, which marks every answer, a
    success too, ``MaxAttemptsReached``; the lean path reports 0 retries.)"""
    resp = outcome.response if isinstance(outcome, botocore.exceptions.ClientError) else outcome
    meta = resp.get("ResponseMetadata") if isinstance(resp, dict) else None
    if not isinstance(meta, dict):
        return
    meta["RetryAttempts"] = attempts - 1
    if gave_up:
        meta["MaxAttemptsReached"] = True
    else:
        meta.pop("MaxAttemptsReached", None)


#: Whether :meth:`Dynamo.call` may send again an attempt whose outcome is unknown (a read
#: timeout, a dropped connection, a 5xx: the request may have been applied). A writer that
#: cannot repeat its write safely (an ``ADD``, a conditional write: a second application, or a
#: condition failing on its own first effect) sets it False around the call and decides itself
#: from a read; the raised error then has ``outcome_unknown = True`` (issue 25, r25's B2).
RETRY_UNKNOWN: ContextVar[bool] = ContextVar("reshard_retry_unknown", default=True)

#: Network failures before the request was sent: never applied.
_NOT_SENT = (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError)


def outcome_unknown(exc: BaseException) -> bool:
    """Whether a failed attempt may have been applied all the same (its answer was lost)."""
    if isinstance(exc, botocore.exceptions.ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return code not in THROTTLE_CODES and (code in TRANSIENT_CODES or status >= 500)
    return isinstance(exc, _NETWORK_ERRORS) and not isinstance(exc, _NOT_SENT)


def _is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, botocore.exceptions.ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return code in THROTTLE_CODES or code in TRANSIENT_CODES or status >= 500
    return isinstance(exc, _NETWORK_ERRORS)


class _since(stop_base):
    """tenacity's ``stop_after_delay``, counted from ``started`` (the call's first attempt,
    sent before tenacity was involved) instead of from tenacity's own start."""

    def __init__(self, started: float, seconds: float):
        self.started, self.seconds = started, seconds

    def __call__(self, retry_state: RetryCallState) -> bool:
        return time.monotonic() - self.started >= self.seconds


def throttle_reason(exc: BaseException) -> str:
    """Why DynamoDB throttled: the first of its ``ThrottlingReasons`` when the answer has them
    (the API reference's ThrottlingReason), else the error code."""
    if isinstance(exc, botocore.exceptions.ClientError):
        reasons = exc.response.get("ThrottlingReasons") or exc.response.get("Error", {}).get("ThrottlingReasons")
        if isinstance(reasons, list) and reasons and isinstance(reasons[0], dict) and reasons[0].get("reason"):
            return str(reasons[0]["reason"])[:100]
    return _code(exc)


class _Unanswered(stop_base):
    """Stop after ``attempts`` while the endpoint has never answered (see FIRST_CONTACT_ATTEMPTS)."""

    def __init__(self, dynamo: "Dynamo", attempts: int):
        self.dynamo, self.attempts = dynamo, attempts

    def __call__(self, retry_state: RetryCallState) -> bool:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        return (retry_state.attempt_number >= self.attempts and self.dynamo._gives_up_unanswered()
                and isinstance(exc, botocore.exceptions.EndpointConnectionError))


def _why_unreachable(exc: BaseException) -> str:
    """"connection refused", "unknown host", ... from botocore's EndpointConnectionError."""
    import re
    text = str(getattr(exc, "kwargs", {}).get("error", "") or exc)
    m = re.search(r"\[Errno -?\d+\] ([^\]\)'\"]+)", text)
    reason = (m.group(1) if m else text).strip().rstrip(".")
    if "Name or service not known" in reason or "nodename nor servname" in reason or "not known" in reason:
        return "unknown host"
    return reason[:1].lower() + reason[1:] if reason else "no connection"


def _code(exc: BaseException) -> str:
    if isinstance(exc, botocore.exceptions.ClientError):
        return exc.response.get("Error", {}).get("Code", "")
    return type(exc).__name__


def translate(operation: str, exc: BaseException) -> errors.AWSError:
    """A reshard exception for a botocore failure, with code and request id.

    A DynamoDB refusal (a ``ClientError``) stays the botocore class it was (e.g.
    ``client.exceptions.ConditionalCheckFailedException``) with its ``response`` dict, and
    is also reshard's class: applications' ``except ClientError`` handlers and reshard's
    own ``except errors.ConditionalCheckFailed`` both see it.
    """
    if isinstance(exc, botocore.exceptions.ClientError):
        _scrub_client_error(exc)
        err = exc.response.get("Error", {})
        code = err.get("Code", "Unknown")
        msg = err.get("Message", "") or str(exc)
        rid = exc.response.get("ResponseMetadata", {}).get("RequestId")
        if code == "ConditionalCheckFailedException":
            cls = errors.ConditionalCheckFailed
        elif code in ("AccessDeniedException", "UnrecognizedClientException", "AccessDenied"):
            cls = errors.AccessDenied
        elif code == "ResourceNotFoundException":
            cls = errors.ResourceNotFound
        else:
            cls = errors.AWSError
        out = _client_error_class(cls, type(exc))(operation, code, msg, rid)
        out.response = exc.response
        out.operation_name = exc.operation_name
        return out
    # Configuration, not a failure of the call: bad input (exit 2), like a bad --profile.
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return errors.AWSConfigError(operation, "NoCredentials", "no AWS credentials found "
                                     "(set a profile, AWS_ACCESS_KEY_ID, or use --endpoint-url for a local server)")
    if isinstance(exc, botocore.exceptions.NoRegionError):
        return errors.AWSConfigError(operation, "NoRegion", f"no AWS region set ({REGION_HELP})")
    if isinstance(exc, (botocore.exceptions.PartialCredentialsError, botocore.exceptions.ProfileNotFound,
                        botocore.exceptions.InvalidConfigError, botocore.exceptions.CredentialRetrievalError)):
        return errors.AWSConfigError(operation, type(exc).__name__, str(exc))
    return errors.AWSError(operation, type(exc).__name__, str(exc))


def _scrub_client_error(exc: botocore.exceptions.ClientError) -> None:
    """Scrub a botocore error in place: it stays attached as the ``__cause__`` of ours, so a
    logged traceback prints its text too (``errors.scrub``: an InvalidSignatureException
    quotes the signed request, session token included)."""
    err = exc.response.get("Error") if isinstance(exc.response, dict) else None
    if isinstance(err, dict) and isinstance(err.get("Message"), str):
        err["Message"] = errors.scrub(err["Message"])
    exc.args = tuple(errors.scrub(a) if isinstance(a, str) else a for a in exc.args)


_COMBINED: dict[tuple[type, type], type] = {}


def _client_error_class(reshard_cls: type, botocore_cls: type) -> type:
    """A class that is both ``reshard_cls`` and ``botocore_cls`` (named like the latter), cached."""
    cls = _COMBINED.get((reshard_cls, botocore_cls))
    if cls is None:
        def __init__(self, operation, code, message, request_id=None):
            # AWSError's __init__ only: ClientError's takes a response dict, set by translate().
            errors.AWSError.__init__(self, operation, code, message, request_id)

        cls = type(botocore_cls.__name__, (reshard_cls, botocore_cls),
                   {"__init__": __init__, "__module__": botocore_cls.__module__,
                    "__reduce__": Exception.__reduce__})
        cls = _COMBINED.setdefault((reshard_cls, botocore_cls), cls)
    return cls


class Dynamo:
    """A DynamoDB client wrapped by reshard's retry, error and capacity policy.

    Thread-safe: botocore clients are, and the stats are guarded by a lock.
    Listeners: ``on_capacity(table, units)`` after every call that returned
    ConsumedCapacity; ``on_throttle(operation)`` for every throttling answer.
    """

    def __init__(self, client=None, *, endpoint_url: str | None = None, region: str | None = None,
                 profile: str | None = None, retry: RetryPolicy | None = None, max_pool: int = 32,
                 read_timeout: float = READ_TIMEOUT_SECONDS, connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
                 sleep: Callable[[float], None] | None = None, first_contact_attempts: int | None = None,
                 client_retries: bool = False, background: bool = False):
        self.retry = retry or RetryPolicy()
        #: botocore retries this client's requests itself (an application's client, under its own
        #: retry configuration, :meth:`for_app`): a request on botocore's path gets one call here,
        #: botocore's attempts inside it; the lean path, which has no botocore retry handler,
        #: gets ``retry`` -- the same policy, read from the client's config.
        self.client_retries = client_retries
        # None: every call gets the whole retry policy (the shim: an app may start before its
        # local server listens). The CLI gives FIRST_CONTACT_ATTEMPTS.
        self.first_contact_attempts = first_contact_attempts
        self.stats = CallStats()
        self._lock = threading.Lock()
        self._capacity_listeners: list[Callable[[str, float], None]] = []
        self._throttle_listeners: list[Callable[[str], None]] = []
        self._sleep = sleep
        # How our own client was made, so :meth:`bounded` can make one with shorter timeouts.
        self._client_args = None
        if client is None:
            self._client_args = {"endpoint_url": endpoint_url, "region": region, "profile": profile,
                                 "max_pool": max_pool}
            client = make_client(read_timeout=read_timeout, connect_timeout=connect_timeout, **self._client_args)
        self.client = client
        self.endpoint_url = endpoint_url or client.meta.endpoint_url
        # An endpoint someone named (else AWS's own, where a refused connection is the network's
        # bad moment, not a typo): only such an endpoint is given up on at first contact.
        self.endpoint_source = endpoint_source(endpoint_url) if self._client_args is not None else None
        self.region = client.meta.region_name
        # Single-item writes without returned values, GetItem and BatchGetItem take the lean
        # path (reshard/aws/lean.py): a fraction of boto3's client CPU per request, same retries, errors and hooks here.
        # ``background``: reshard's own requests beside an application's (the shim's control
        # refresh, PhaseCache): the lean path's attempts bounded by the timeouts given here, not
        # the client's, and never moved to botocore's path for a tracer (no app trace holds them).
        cfg = getattr(getattr(client, "meta", None), "config", None)
        self._lean = lean_sender(
            client, connect_timeout=connect_timeout if background else getattr(cfg, "connect_timeout", None)
            or connect_timeout, read_timeout=read_timeout if background else getattr(cfg, "read_timeout", None)
            or read_timeout)
        if self._lean is not None and background:
            self._lean.yield_to_tracers = False
        # Requests with a horizon are signed with a chosen date (docs/late-writes.md): the lean
        # path does it itself, a botocore client through a choose-signer handler.
        if hasattr(getattr(client, "meta", None), "events"):
            signing.install(client)
        self._answers = threading.local()

    # -- time bounds
    @property
    def attempt_seconds(self) -> float:
        """The longest one attempt of a request can be in flight: connect + read timeout.

        A write made with ``guard=`` (:meth:`call`) is checked before every attempt, so
        this bounds how long after its last check such a write can still land (the
        "maximum request duration" of the jobs' time fence and of the gates that wait for
        job leases). A client built elsewhere is read for its own timeouts.
        """
        cfg = getattr(getattr(self.client, "meta", None), "config", None)
        connect = getattr(cfg, "connect_timeout", None) or CONNECT_TIMEOUT_SECONDS
        read = getattr(cfg, "read_timeout", None) or READ_TIMEOUT_SECONDS
        return float(connect) + float(read)

    def bounded(self, attempt_seconds: float) -> "Dynamo":
        """This Dynamo if one attempt is bounded by ``attempt_seconds``; else the same endpoint,
        retry policy, stats and listeners over a client with shorter timeouts (a job whose
        lease is short needs requests that cannot stay in flight for most of it)."""
        if self.attempt_seconds <= attempt_seconds:
            return self
        if self._client_args is None:
            raise errors.BadInput(f"the lease is too short for this client's timeouts (one request may take "
                                  f"{self.attempt_seconds:g}s; at most {attempt_seconds:g}s allowed): use a "
                                  f"longer --lease-seconds")
        connect = min(CONNECT_TIMEOUT_SECONDS, attempt_seconds / 3)
        other = Dynamo(retry=self.retry, sleep=self._sleep, connect_timeout=connect,
                       read_timeout=attempt_seconds - connect, first_contact_attempts=self.first_contact_attempts,
                       **self._client_args)
        other.stats = self.stats
        other._lock = self._lock
        other._capacity_listeners = self._capacity_listeners
        other._throttle_listeners = self._throttle_listeners
        return other

    @property
    def max_request_seconds(self) -> float:
        """The longest an *unguarded* call can keep sending attempts: every attempt's bound
        plus the backoffs between them, capped by the policy's total time plus one attempt.
        The total time is checked when an attempt fails, before the backoff: a last attempt
        may start up to one backoff after it, and then takes up to one attempt's bound."""
        p = self.retry
        every = p.max_attempts * self.attempt_seconds + (p.max_attempts - 1) * p.max_backoff_seconds
        return min(every, p.max_seconds + p.max_backoff_seconds + self.attempt_seconds)

    # -- listeners
    def add_capacity_listener(self, fn: Callable[[str, float], None]) -> None:
        self._capacity_listeners.append(fn)

    def note_capacity(self, table: str, units: float) -> None:
        """Tell the capacity listeners about ``units`` spent on ``table`` outside :meth:`call`
        (a combined job's page answered from a Scan already counted: a token amount, so the
        budget refunds its estimate instead of charging the scan twice)."""
        for fn in self._capacity_listeners:
            fn(table, units)

    def throttle_reasons(self) -> dict:
        """Throttled answers so far by reason (:attr:`CallStats.throttle_reasons`), a copy."""
        with self._lock:
            return dict(self.stats.throttle_reasons)

    def add_throttle_listener(self, fn: Callable[[str], None]) -> None:
        self._throttle_listeners.append(fn)

    @classmethod
    def for_app(cls, client, **kwargs) -> "Dynamo":
        """A Dynamo over an application's client whose retries and timeouts stay in force: its
        config's attempts and backoff (:func:`client_retry_policy`) for every request, made by
        botocore on botocore's path and by :meth:`call` on the lean path (whose attempts are
        bounded by the client's own timeouts)."""
        return cls(client, retry=client_retry_policy(client), client_retries=retries_in_client(client), **kwargs)

    def with_retry(self, retry: RetryPolicy, *, connect_timeout: float | None = None,
                   read_timeout: float | None = None) -> "Dynamo":
        """The same client and listeners under another retry policy. With timeouts given, the
        lean path's attempts are bounded by them instead of the client's (requests on
        botocore's path keep the client's own)."""
        other = Dynamo(self.client, retry=retry, sleep=self._sleep, first_contact_attempts=self.first_contact_attempts,
                       client_retries=self.client_retries,
                       **({"connect_timeout": connect_timeout, "read_timeout": read_timeout,
                           "background": True} if connect_timeout is not None else {}))
        other.endpoint_source = self.endpoint_source
        other.stats = self.stats
        other._lock = self._lock
        other._capacity_listeners = self._capacity_listeners
        other._throttle_listeners = self._throttle_listeners
        return other

    # -- the server's clock
    def answer_date(self) -> float | None:
        """The server's clock (epoch seconds, from the HTTP ``Date`` header) of the last answer
        this thread received through :meth:`call` -- an error's too; None if it carried none."""
        return getattr(self._answers, "date", None)

    def _note_answer(self, resp: dict | None) -> None:
        headers = (resp or {}).get("ResponseMetadata", {}).get("HTTPHeaders") or {}
        date = parse_http_date(headers.get("date") or headers.get("Date"))
        if date is not None:
            self._answers.date = date

    # -- the choke point
    def call(self, operation: str, *, guard: Callable[[], None] | None = None,
             horizon: Callable[[], float | None] | None = None, **kwargs) -> dict:
        """Call a DynamoDB operation (botocore's snake_case name) under the retry policy.

        ``guard`` runs before every attempt, after any backoff sleep, and may raise to
        stop the call before that attempt is sent (a job's lease deadline: a worker whose
        lease may have expired sends no further write, not even a retry).

        ``horizon`` (after the guard, before every attempt) returns the last server time
        (epoch seconds) at which this attempt may land, or None for none: the attempt is
        signed ``horizon - W`` earlier, so DynamoDB refuses it after that time whatever
        delays it (docs/late-writes.md). It may raise to stop the call, as ``guard``.
        """
        lean = self._lean
        on_lean = lean is not None and lean.handles(operation, kwargs)
        if on_lean:
            def method(**kw):
                return lean.send(operation, kw)
        else:
            client_method = getattr(self.client, operation)

            def method(**kw):
                try:
                    return client_method(**kw)
                except _PARSER_ERRORS as e:
                    # botocore's parser met an answer that is no DynamoDB answer (a 2xx body
                    # ``[]`` raises AttributeError in it): a bad answer, like the lean path's,
                    # never a raw exception out of the choke point.
                    raise UnreadableAnswer(operation=operation, size="?",
                                           why=f"botocore raised {type(e).__name__}: {e}") from e
        if guard is not None or horizon is not None:
            send = method

            def method(**kw):
                if guard is not None:
                    guard()
                when = horizon() if horizon is not None else None
                if when is None:
                    return send(**kw)
                token = signing.SIGN_DATE.set(sign_epoch(when))
                try:
                    return send(**kw)
                finally:
                    signing.SIGN_DATE.reset(token)

        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception()
            code = _code(exc)
            with self._lock:
                self.stats.add(self.stats.retries, operation)
                if code in THROTTLE_CODES:
                    self.stats.throttles += 1
                    self.stats.add(self.stats.throttle_reasons, throttle_reason(exc))
            if code in THROTTLE_CODES:
                for fn in self._throttle_listeners:
                    fn(operation)

        p = self.retry
        # Who retries: this loop, unless botocore does (an application's client under its own
        # retry configuration, on botocore's path): then its attempts are inside one call here.
        ours = on_lean or not self.client_retries
        retry_unknown = RETRY_UNKNOWN.get()
        attempts = 1
        started = time.monotonic()
        try:
            # The first attempt outside tenacity: most calls succeed at once, and building the
            # retry machinery costs 15-40 us of client CPU per request (issue 16's profile).
            resp = method(**kwargs)
        except errors.ReshardError:
            raise  # a guard's refusal (some are ClientErrors too): already reshard's
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as e:
            if isinstance(e, botocore.exceptions.ClientError):
                _answered.add(self.endpoint_url)
                self._note_answer(e.response)
            unsent_again = not retry_unknown and outcome_unknown(e)
            if not _is_retryable(e) or p.max_attempts <= 1 or not ours or unsent_again:
                if ours:
                    _retry_metadata(e, 1, _is_retryable(e))
                raise self._failure(operation, e, unsent_again) from e
            first = e
        else:
            first = None
        if first is not None:
            replayed = False

            def again(**kw):
                # tenacity's attempt 1 is the one already sent: its failure is replayed, so
                # the backoff, the stats, the throttle listeners and the attempt count are
                # exactly those of a call tenacity made from the start.
                nonlocal replayed, attempts
                if not replayed:
                    replayed = True
                    raise first
                attempts += 1
                return method(**kw)

            stop = stop_after_attempt(p.max_attempts) | _since(started, p.max_seconds)
            if self._gives_up_unanswered() and isinstance(first, botocore.exceptions.EndpointConnectionError):
                stop = stop | _Unanswered(self, self.first_contact_attempts)
            retrying = Retrying(
                retry=retry_if_exception(lambda e: _is_retryable(e) and (retry_unknown or not outcome_unknown(e))),
                # the total time counts from the first attempt, not from tenacity's start
                stop=stop,
                wait=wait_random_exponential(multiplier=p.base_seconds, max=p.max_backoff_seconds),
                before_sleep=before_sleep,
                reraise=True,
                **({"sleep": self._sleep} if self._sleep else {}),
            )
            try:
                resp = retrying(again, **kwargs)
            except errors.ReshardError:
                raise
            except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as e:
                if isinstance(e, botocore.exceptions.ClientError):
                    self._note_answer(e.response)
                _retry_metadata(e, attempts, _is_retryable(e))
                raise self._failure(operation, e, not retry_unknown and outcome_unknown(e)) from e
        if ours:
            _retry_metadata(resp, attempts, False)
        _answered.add(self.endpoint_url)
        self._note_answer(resp)
        with self._lock:
            self.stats.add(self.stats.calls, operation)
        cc = resp.get("ConsumedCapacity")
        if cc is not None:
            for entry in (cc if isinstance(cc, list) else [cc]):
                units = float(entry.get("CapacityUnits", 0) or 0)
                table = entry.get("TableName", "")
                with self._lock:
                    self.stats.add(self.stats.consumed, table, units)
                for fn in self._capacity_listeners:
                    fn(table, units)
        return resp

    def _gives_up_unanswered(self) -> bool:
        """Whether a refused connection ends this call after a few attempts: a command's call
        to an endpoint it was given that never answered this process."""
        return bool(self.first_contact_attempts) and self.endpoint_source is not None \
            and self.endpoint_url not in _answered

    def _failure(self, operation: str, exc: BaseException, unknown: bool = False) -> errors.ReshardError:
        """The reshard error for a call's last failure (:func:`translate`), or, for a given
        endpoint that never answered, bad input naming it. ``unknown``: the attempt may have
        been applied and was not sent again (:data:`RETRY_UNKNOWN`): ``outcome_unknown`` on it."""
        if unknown:
            err = translate(operation, exc)
            err.outcome_unknown = True
            return err
        if isinstance(exc, botocore.exceptions.ClientError):
            _answered.add(self.endpoint_url)
        elif isinstance(exc, botocore.exceptions.EndpointConnectionError) and self._gives_up_unanswered():
            return errors.BadInput(f"nothing answers at {self.endpoint_url} ({_why_unreachable(exc)}; "
                                   f"the endpoint comes from {self.endpoint_source}): start the server there "
                                   f"(reshard local starts one) or fix {self.endpoint_source}")
        return translate(operation, exc)

    # -- loops DynamoDB leaves to clients
    def batch_write(self, table: str, requests: list[dict], *, capacity: bool = False,
                    guard: Callable[[], None] | None = None,
                    horizon: Callable[[], float | None] | None = None) -> int:
        """BatchWriteItem in chunks of 25, re-sending UnprocessedItems until done.

        Returns the number of calls made. Unprocessed items are a form of throttling:
        they are reported to throttle listeners and re-sent after a backoff.
        """
        calls = 0
        for start in range(0, len(requests), 25):
            pending = {table: requests[start:start + 25]}
            attempt = 0
            while pending:
                kwargs = {"RequestItems": pending}
                if capacity:
                    kwargs["ReturnConsumedCapacity"] = "TOTAL"
                resp = self.call("batch_write_item", guard=guard, horizon=horizon, **kwargs)
                calls += 1
                pending = resp.get("UnprocessedItems") or {}
                if pending:
                    attempt += 1
                    with self._lock:
                        self.stats.add(self.stats.throttle_reasons, "UnprocessedItems")
                    for fn in self._throttle_listeners:
                        fn("batch_write_item")
                    self._backoff(attempt)
        return calls

    def batch_get(self, table: str, keys: list[dict], *, consistent: bool = False,
                  capacity: bool = False, projection: dict | None = None,
                  last_response: dict | None = None,
                  horizon: Callable[[], float | None] | None = None) -> list[dict]:
        """BatchGetItem in chunks of 100, re-asking UnprocessedKeys until done.

        ``last_response``: a dict updated with the last raw response (its ResponseMetadata).
        ``horizon``: as :meth:`call`'s, for every request.
        """
        out: list[dict] = []
        for start in range(0, len(keys), 100):
            req = {"Keys": keys[start:start + 100], "ConsistentRead": consistent}
            if projection:
                req.update(projection)
            pending = {table: req}
            attempt = 0
            while pending:
                kwargs = {"RequestItems": pending}
                if capacity:
                    kwargs["ReturnConsumedCapacity"] = "TOTAL"
                resp = self.call("batch_get_item", horizon=horizon, **kwargs)
                if last_response is not None:
                    last_response.update(resp)
                out.extend(resp.get("Responses", {}).get(table, []))
                pending = resp.get("UnprocessedKeys") or {}
                if pending:
                    attempt += 1
                    with self._lock:
                        self.stats.add(self.stats.throttle_reasons, "UnprocessedKeys")
                    for fn in self._throttle_listeners:
                        fn("batch_get_item")
                    self._backoff(attempt)
        return out

    def query_all(self, **kwargs) -> Iterator[dict]:
        """Every item of a Query, page after page."""
        while True:
            resp = self.call("query", **kwargs)
            yield from resp.get("Items", [])
            lek = resp.get("LastEvaluatedKey")
            if not lek:
                return
            kwargs["ExclusiveStartKey"] = lek

    def _backoff(self, attempt: int) -> None:
        import random
        import time
        p = self.retry
        if attempt > p.max_attempts * 3:
            raise errors.AWSError("batch", "UnprocessedItems", f"still unprocessed after {attempt} attempts")
        delay = random.uniform(0, min(p.max_backoff_seconds, p.base_seconds * 2 ** attempt))
        (self._sleep or time.sleep)(delay)

    # -- table metadata
    def describe_table(self, table: str) -> dict:
        try:
            return self.call("describe_table", TableName=table)["Table"]
        except errors.ResourceNotFound:
            raise errors.TableProblem(f"table {table!r} does not exist at {self.endpoint_url} "
                                      f"({self.region})") from None


class _OncePaths(list):
    """A loader's search paths where a path already there is not added again (boto3 adds
    its own data path to the loader of every session it makes)."""

    def append(self, path) -> None:
        if path not in self:
            super().append(path)


_loader = None
_loader_lock = threading.Lock()


def _session(profile: str | None) -> boto3.session.Session:
    """A fresh boto3 session (its own credentials, region and config, read now) that shares
    one botocore data loader with every other: parsing the service model JSON was about
    five sixths of the CPU of making a client (~80 ms), paid by every job, shim and test."""
    global _loader
    import botocore.loaders
    import botocore.session
    core = botocore.session.get_session()
    with _loader_lock:
        if _loader is None:
            _loader = core.get_component("data_loader")  # made from this process's AWS_DATA_PATH
            _loader._search_paths = _OncePaths(_loader.search_paths)
        core.register_component("data_loader", _loader)
        return boto3.session.Session(botocore_session=core, profile_name=profile)


def endpoint_source(endpoint_url: str | None) -> str | None:
    """Where the endpoint a client is made for comes from: the option, one of the two variables
    botocore reads (aws-cli's order), or None (AWS's own endpoint for the region)."""
    if endpoint_url:
        return "--endpoint-url"
    for var in ("AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL"):
        if os.environ.get(var):
            return var
    return None


def _endpoint(endpoint_url: str | None) -> str | None:
    """The endpoint a client is made for, checked: a URL with an http(s) scheme and a host
    (botocore takes ``localhost:8000`` for a scheme ``localhost`` and fails later, unclearly)."""
    from urllib.parse import urlsplit
    source = endpoint_source(endpoint_url)
    if source is None:
        return None
    url = endpoint_url or os.environ[source]
    if "://" not in url:
        raise errors.BadInput(f"{source} {url!r} has no scheme: write http://{url} for a local server "
                              f"(or https://{url})")
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as e:
        raise errors.BadInput(f"{source} {url!r}: {e} (give a URL such as http://127.0.0.1:8000)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise errors.BadInput(f"{source} {url!r} is not an http:// or https:// URL with a host "
                              f"(give a URL such as http://127.0.0.1:8000)")
    return url


def _check_profile(session: boto3.session.Session, profile: str | None) -> None:
    """A named profile that the AWS files do not have is one line now, not a ProfileNotFound from
    deep inside botocore at the first request (which the region lookup makes before any ``try``)."""
    name = profile or os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE")
    if not name or name == "default":  # botocore reads a missing default profile as empty
        return
    known = session.available_profiles
    if name in known:
        return
    source = "--profile" if profile else ("AWS_PROFILE" if os.environ.get("AWS_PROFILE") else "AWS_DEFAULT_PROFILE")
    files = " or ".join(os.environ.get(var) or default for var, default in (
        ("AWS_CONFIG_FILE", "~/.aws/config"), ("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials")))
    there = f"profiles there: {', '.join(sorted(known))}" if known else "no profiles there"
    raise errors.BadInput(f"AWS profile {name!r} ({source}) is not in {files} ({there}); "
                          f"`aws configure --profile {name}` creates it")


def resolve_region(region: str | None, session: boto3.session.Session, local: bool = False) -> str | None:
    """The region, as aws-cli v2 finds it: ``--region``, then ``AWS_REGION``, then
    ``AWS_DEFAULT_REGION``, then the profile's ``region`` (botocore reads those two itself, but
    not AWS_REGION); a local endpoint without any gets us-east-1 (local servers ignore it)."""
    return (region or os.environ.get("AWS_REGION") or session.region_name
            or ("us-east-1" if local else None))


def make_client(*, endpoint_url: str | None = None, region: str | None = None, profile: str | None = None,
                max_pool: int = 32, read_timeout: float = READ_TIMEOUT_SECONDS,
                connect_timeout: float = CONNECT_TIMEOUT_SECONDS, session: boto3.session.Session | None = None,
                config: botocore.config.Config | None = None):
    """A botocore DynamoDB client with botocore's retries off (we retry in one place).

    ``--endpoint-url`` (or ``AWS_ENDPOINT_URL[_DYNAMODB]``, which botocore reads itself)
    points at a local server; there, missing credentials and region get harmless
    placeholders so a fresh machine needs no AWS setup. Bad configuration (a missing profile,
    a broken config file, no region, an endpoint that is no URL) is one line of bad input.

    ``session`` (an application's boto3 Session: its credentials, profile and region) is used
    instead of a fresh one; ``config`` (its botocore Config) is merged over reshard's: every
    option it sets wins (its retries, timeouts, pool, user agent...).
    """
    endpoint = _endpoint(endpoint_url)
    local = bool(endpoint) and _is_loopback(endpoint)
    try:
        if session is None:
            session = _session(profile)
            _check_profile(session, profile)
        region = resolve_region(region, session, local)
        kwargs: dict[str, Any] = {}
        if local and session.get_credentials() is None:
            kwargs.update(aws_access_key_id="reshard-local", aws_secret_access_key="reshard-local")
    except botocore.exceptions.BotoCoreError as e:  # a broken config file, a bad credential_process, ...
        raise errors.BadInput(f"AWS configuration: {e}") from None
    ours = botocore.config.Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        # Client-side validation walks every attribute of every item again (about a sixth
        # of the backfill's CPU); reshard builds its requests itself, and DynamoDB
        # validates them anyway.
        parameter_validation=False,
        max_pool_connections=max_pool,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        tcp_keepalive=True,
    )
    config = ours if config is None else ours.merge(config)
    try:
        return session.client("dynamodb", endpoint_url=endpoint_url, region_name=region, config=config, **kwargs)
    except botocore.exceptions.NoRegionError:
        raise errors.BadInput(f"no AWS region set: {REGION_HELP}") from None
    except ValueError as e:  # botocore: "Invalid endpoint: ..."
        raise errors.BadInput(f"--endpoint-url {endpoint_url or endpoint!r}: {e} (give a URL such as "
                              "http://127.0.0.1:8000)") from None
    except botocore.exceptions.BotoCoreError as e:  # PartialCredentials, ...
        raise errors.BadInput(f"AWS configuration: {e}") from None


def _is_loopback(url: str) -> bool:
    from urllib.parse import urlparse
    host = (urlparse(url).hostname or "").lower()
    return host in ("localhost", "::1") or host.startswith("127.")


def expression_kwargs(condition: str | None = None, names: dict | None = None, values: dict | None = None) -> dict:
    """The condition keyword arguments of a call, leaving out the empty ones (DynamoDB refuses them)."""
    out: dict[str, Any] = {}
    if condition:
        out["ConditionExpression"] = condition
    if names:
        out["ExpressionAttributeNames"] = names
    if values:
        out["ExpressionAttributeValues"] = values
    return out

