"""What a :class:`~reshard.shim.table.ShardedTable` raises: botocore ``ClientError``\\ s.

An application written against boto3 handles failures with ``except ClientError`` and
``e.response["Error"]["Code"]``; the shim keeps those handlers working. Every error a
shim method raises is a ``botocore.exceptions.ClientError`` *and* the reshard class it
always was (so ``except reshard.errors.ConditionalCheckFailed`` works too):

* DynamoDB's own refusals (``ConditionalCheckFailedException``, ``ValidationException``,
  ``ResourceNotFoundException`` ...) are instances of the very class botocore raised
  (``client.exceptions.ConditionalCheckFailedException``), carrying DynamoDB's
  ``response`` dict (``Error``, ``ResponseMetadata``) -- see ``reshard.aws.dynamo.translate``;
* the shim's own refusals are the classes below, with these codes:

  ================================  ==============================  =====================
  class                             ``response["Error"]["Code"]``   also a
  ================================  ==============================  =====================
  :class:`ShimValidationError`      ``ValidationException``         ``errors.BadInput``
  :class:`ItemTooLarge`             ``ValidationException``         ``errors.AWSError``
  :class:`ShimUnavailable`          ``ReshardShimUnavailable``      ``errors.ShimUnavailable``
  :class:`SwitchInProgress`         ``ReshardSwitchInProgress``     ``errors.SwitchInProgress``
  :class:`ScanInterrupted`          ``ReshardScanInterrupted``      ``errors.ScanInterrupted``
  :class:`OldValuesUnknown`         ``ReshardOldValuesUnknown``     ``errors.ReshardError``
  :class:`OutcomeUnknown`           ``ReshardOutcomeUnknown``       ``errors.ReshardError``
  :class:`ShimAWSError`             its ``code`` (e.g.              ``errors.AWSError``
                                    ``ReshardVersionConflict``)
  ================================  ==============================  =====================
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, TypeVar

import botocore.exceptions

from reshard import errors
from reshard.shim import metrics


class ShimClientError(botocore.exceptions.ClientError):
    """Base of the shim's own ``ClientError``\\ s (not of DynamoDB's, which keep botocore's classes)."""

    code = "ReshardError"

    def __init__(self, message: str, operation_name: str = "reshard", code: str | None = None):
        # ClientError.__init__ formats its own text; keep reshard's one-line message instead.
        code = code or type(self).code
        self.response = {"Error": {"Code": code, "Message": message}}
        self.operation_name = operation_name
        Exception.__init__(self, message)


class ShimValidationError(errors.BadInput, ShimClientError):
    """The request is not valid for this table (DynamoDB would say ``ValidationException``)."""

    code = "ValidationException"


class ShimUnavailable(errors.ShimUnavailable, ShimClientError):
    """The shim's phase is older than its liveness window: nothing was sent (retry later)."""

    code = "ReshardShimUnavailable"


class SwitchInProgress(errors.SwitchInProgress, ShimUnavailable):
    """The fleet is switching authority; the request was held, never sent. Retrying is safe."""

    code = "ReshardSwitchInProgress"


class ScanInterrupted(errors.ScanInterrupted, ShimClientError):
    """A paged scan resumed across a change of the layouts the shim reads: restart the scan."""

    code = "ReshardScanInterrupted"


class OldValuesUnknown(errors.ReshardError, ShimClientError):
    """The write landed exactly once, but the ``ReturnValues`` old values it asked for are lost.

    Its first attempt was applied and the answer was lost on the way (a dropped connection, a
    timeout); the retry met that attempt already stored (its own version) and applied nothing
    again. The old values existed only in the lost answer (DynamoDB keeps no history), so
    ``ALL_OLD`` / ``UPDATED_OLD`` cannot be answered truthfully. Raised after the write was
    completed in every layout: do not send the write again. ``landed`` is True.
    """

    code = "ReshardOldValuesUnknown"
    landed = True

    def __init__(self, operation: str):
        super().__init__(f"{operation}: the write landed exactly once, but the old values asked for with ReturnValues "
                         "were in its answer, which was lost (the retry found the write already applied and did not "
                         "apply it again); the write is complete in every layout: do not send it again",
                         operation)


class OutcomeUnknown(errors.ReshardError, ShimClientError):
    """A write whose answer was lost, and whose outcome cannot be known: it may have landed once.

    Its attempt's answer never came (a timeout, a dropped connection, a 5xx) and another
    writer's newer write is stored at the key now, so nothing tells whether the attempt was
    applied before it. Sending it again could apply an ``ADD`` twice, or fail a condition on
    its own first effect; so it is not sent again and the application hears what a plain
    client's timeout would have told it: the outcome is unknown (``landed`` is None). The
    item holds the other writer's write, which is later than ours in any order.
    """

    code = "ReshardOutcomeUnknown"
    landed = None

    def __init__(self, operation: str):
        super().__init__(f"{operation}: its answer was lost and another writer's write is stored at the key now, so "
                         "whether it was applied first cannot be known; it was not sent again (it may not be "
                         "applied twice). Read the item to decide whether to write again", operation)


class ShimAWSError(errors.AWSError, ShimClientError):
    """A reshard-detected failure of a DynamoDB request (lost version race, no credentials ...)."""

    def __init__(self, operation: str, code: str, message: str, request_id: str | None = None):
        errors.AWSError.__init__(self, operation, code, message, request_id)
        self.response = {"Error": {"Code": code, "Message": message}}
        self.operation_name = operation


class ItemTooLarge(ShimAWSError):
    """A write refused before anything was stored: one layout's copy would exceed 400 KB."""

    def __init__(self, operation: str, message: str):
        super().__init__(operation, "ValidationException", message)


_BY_CLASS = ((errors.SwitchInProgress, SwitchInProgress), (errors.ShimUnavailable, ShimUnavailable),
             (errors.ScanInterrupted, ScanInterrupted),
             (errors.BadInput, ShimValidationError))


def as_client_error(e: errors.ReshardError, operation: str) -> BaseException:
    """``e`` as a ``ClientError`` (``e`` itself when it already is one)."""
    if isinstance(e, botocore.exceptions.ClientError):
        return e
    if isinstance(e, errors.AWSError):
        out: BaseException = ShimAWSError(e.operation, e.code, e.aws_message, e.request_id)
    else:
        cls = next((c for base, c in _BY_CLASS if isinstance(e, base)), None)
        if cls is None:
            out = ShimAWSError(operation, type(e).__name__, str(e))
        else:
            out = cls(str(e), operation)
    # Keep what callers may read (retryable, reason, path ...), and the original as the cause.
    for k, v in vars(e).items():
        if k not in ("response", "operation_name"):
            out.__dict__.setdefault(k, v)
    return out


F = TypeVar("F", bound=Callable[..., Any])


def client_errors(operation: str) -> Callable[[F], F]:
    """Decorate a public shim method: reshard's errors leave it as ``ClientError``\\ s, and a
    method of the table itself records its latency (and a ``ShimUnavailable``) in the shim's
    metrics (:mod:`reshard.shim.metrics`; a no-op without an OpenTelemetry SDK)."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def method(self, *args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(self, *args, **kwargs)
            except errors.ReshardError as e:
                if isinstance(e, errors.ShimUnavailable) and hasattr(self, "_phases"):
                    metrics.unavailable(self.migration.id, as_client_error(e, operation).response["Error"]["Code"])
                if isinstance(e, botocore.exceptions.ClientError):
                    raise
                raise as_client_error(e, operation) from e
            finally:
                if hasattr(self, "_phases"):  # the table's methods (a batch writer's are the table's calls)
                    metrics.request_done(self.migration.id, self._phases.phase, operation,
                                         time.perf_counter() - started)
        return method  # type: ignore[return-value]
    return wrap
