"""The exceptions reshard raises, and the exit status each one maps to.

Pure module: imports nothing from AWS or the CLI. The command line catches
:class:`ReshardError` in exactly one place (``reshard.cli.main``) and turns it into one
line on stderr plus :attr:`ReshardError.exit_code`.

Exit status: 0 done; 1 the operation failed or found
differences; 2 bad input or a refused transition.
"""

from __future__ import annotations

import re


# --------------------------------------------------------------------------- secrets

#: What a server's error text (or a dump of a request) may carry that must never reach a
#: terminal, a log or an application's exception: each match is replaced whole, its name
#: included (``Credential=AKIA...`` becomes ``<credential removed>``). AWS's own shapes:
#: ``InvalidSignatureException`` quotes the canonical request (signed headers, the session
#: token among them) and the string to sign; ``IncompleteSignatureException`` quotes the
#: ``Authorization`` header (``Credential=<key id>/...``, ``Signature=<hex>``).
_SECRETS = (
    (re.compile(r"The Canonical String for this request should have been.*?(?:The String-to-Sign should have "
                r"been\s*(?:'[^']*'?|\S*)|\Z)", re.S), "<canonical request and string to sign removed>"),
    (re.compile(r"The String-to-Sign should have been\s*(?:'[^']*'?|\S*)", re.S), "<string to sign removed>"),
    (re.compile(r"x-amz-security-token\s*[:=]\s*[^\s'\"&,;]*", re.I), "<security token removed>"),
    (re.compile(r"(?:aws_)?session_?token['\"]?\s*[:=]\s*['\"]?[^\s'\"&,;]*", re.I), "<session token removed>"),
    (re.compile(r"(?:aws_)?secret_?access_?key(?:_?id)?['\"]?\s*[:=]\s*['\"]?[^\s'\"&,;]*", re.I),
     "<secret access key removed>"),
    (re.compile(r"Authorization\s*[:=]\s*(?:AWS4-HMAC-SHA256\s*)?[^\n'\"]*", re.I), "<authorization removed>"),
    (re.compile(r"(?:X-Amz-)?Credential\s*=\s*[^\s,'\"&]*", re.I), "<credential removed>"),
    (re.compile(r"(?:X-Amz-)?Signature\s*=\s*[^\s,'\"&]*", re.I), "<signature removed>"),
    (re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA|AIPA|ANPA|ANVA|AGPA|ABIA|ACCA)[A-Z0-9]{12,}\b"), "<access key id removed>"),
    # A session token quoted bare (STS tokens start with these prefixes, base64 after).
    (re.compile(r"\b(?:IQoJ|FwoG|FQoG)[A-Za-z0-9+/=]{16,}"), "<session token removed>"),
)


def scrub(text: str) -> str:
    """``text`` without credentials, session tokens, signatures and canonical-request dumps.

    The one scrubbing function: every path that shows a server's words runs through it (an
    :class:`AWSError`'s message and the ``response`` it carries, the CLI's error line and
    ``--verbose`` traceback, the shim's log lines, a failed segment's ``last_error``).
    """
    if not text:
        return text
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


class ReshardError(Exception):
    """Base class of every error reshard raises on purpose."""

    exit_code = 1


class BadInput(ReshardError):
    """The operator or the application gave us something we cannot use (exit 2)."""

    exit_code = 2


class MigrationFileError(BadInput):
    """A migration file is missing, unreadable or invalid.

    The message always names the file, the key and what is wrong, in one line:
    ``migrations/x.toml: from.shards: must be an integer from 1 to 1000 (got 0)``.
    """

    def __init__(self, path: str, key: str | None, problem: str):
        self.path = path
        self.key = key
        self.problem = problem
        where = f"{path}: {key}: " if key else f"{path}: "
        super().__init__(where + problem)


class UnmappableItem(ReshardError):
    """An item whose keys cannot be computed or parsed with a layout.

    Never fatal for a backfill: such items are counted, reported and left alone.
    ``reason`` is a short machine-friendly tag (``missing-field``, ``unparseable-key``,
    ``too-large`` ...), ``detail`` the human explanation.
    """

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


class BadVersion(UnmappableItem, BadInput):
    """A stored ``_rs_v`` that no reshard writer can have written (malformed, not a string, or
    further ahead of the clock than the skew bound): never adopted (reshard.core.versions).
    The shim refuses that item's write with it; a job counts the item as unmappable."""

    def __init__(self, detail: str):
        UnmappableItem.__init__(self, "bad-version", detail)
        Exception.__init__(self, detail)


class RefusedTransition(BadInput):
    """A phase change that the rules or the fleet's state do not allow (exit 2)."""


class ConcurrentChange(RefusedTransition):
    """Another operator (or worker) changed the record first; our conditional write lost."""


class JobStopped(ReshardError):
    """A data job is stopping (Ctrl-C, SIGTERM): a request waiting for capacity or for the settle
    window is abandoned with its page (not checkpointed, so the next run redoes it). Exit 130."""

    exit_code = 130


class StartWouldRefuse(ReshardError):
    """``plan`` found what ``start`` refuses (exit 1: the report is printed, the check failed)."""


class FleetLagging(ReshardError):
    """``--wait`` ran out before every live shim acknowledged the phase (exit 1: the operation
    did not finish; the message names the lagging shims)."""


class MigrationNotFound(BadInput):
    """No migration with that id (or file) is registered in the control table."""


class ControlTableMissing(MigrationNotFound):
    """The control table does not exist (so no migration is registered anywhere in it)."""


class TableProblem(BadInput):
    """The DynamoDB table is missing, or its key schema does not match the file."""


class ForeignControlRow(BadInput):
    """A control-table row reshard did not write (unknown schema, or contents that
    disagree with its key): whoever reads it refuses to act on it (fail closed)."""


class ShimUnavailable(ReshardError):
    """The shim refuses to act: its phase cache is older than the liveness window.

    Acting on a stale phase could break the guarantees while the fleet moves on
    without us (our heartbeat has expired, so nobody waits for us), so the shim
    fails the request loudly instead.
    """


class SwitchInProgress(ShimUnavailable):
    """The fleet is switching authority (backfill <-> cutover) and did not finish within the
    shim's hold bound: the request was held and never sent. Retrying is safe."""

    retryable = True


class ScanInterrupted(ReshardError):
    """A paged shim scan was resumed after the migration changed the layouts it reads: the
    pages would designate different copies (an item twice or missed). Restart the scan.
    Also a paged query of a sharded GSI resumed under other index layouts (``_rs_reads``)."""

    retryable = True


class BudgetUnavailable(ReshardError):
    """A process could not hold its share of a run's capacity budget (the budget row in the
    control table was unreachable for longer than its liveness window allows): it sends
    nothing rather than risk the run's budget. The page fails and is retried."""


class AWSError(ReshardError):
    """A DynamoDB call failed after retries. Carries the AWS error code and request id."""

    def __init__(self, operation: str, code: str, message: str, request_id: str | None = None):
        self.operation = operation
        self.code = code
        # A server's words may quote the request's credentials (InvalidSignatureException):
        # scrubbed here, so no path that shows this error can show them.
        message = scrub(message)
        self.aws_message = message
        self.request_id = request_id
        rid = f" (request id {request_id})" if request_id else ""
        # Not super(): the shim's subclasses are also botocore ClientErrors, whose
        # __init__ takes other arguments (reshard.shim.errors, reshard.aws.dynamo.translate).
        Exception.__init__(self, f"{operation} failed: {code}: {message}{rid}")


class AWSConfigError(AWSError):
    """The AWS configuration cannot make a request at all (no credentials, no region, a missing
    profile): the operator fixes the setup, so it is bad input (exit 2), not a failed call."""

    exit_code = 2


class ConditionalCheckFailed(AWSError):
    """The application's own ConditionExpression did not hold on the authoritative copy."""


class AccessDenied(AWSError):
    """The credentials lack a permission reshard needs (the message names the action)."""

    exit_code = 1


class ResourceNotFound(AWSError):
    """A table (the data table or the control table) does not exist."""
