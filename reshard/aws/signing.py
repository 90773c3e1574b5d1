"""Signing a request with a chosen date (the request horizon, docs/late-writes.md).

:meth:`reshard.aws.dynamo.Dynamo.call` sets :data:`SIGN_DATE` (epoch seconds) for the attempt it
sends when the caller gave a horizon. Three senders honour it:

* the lean path (``reshard/aws/lean.py``) signs with it itself;
* a botocore client gets a ``choose-signer`` handler (:func:`install`) that picks
  :class:`DatedSigV4Auth` while the variable is set: botocore's own SigV4 with the chosen date
  instead of "now" (``SigV4Auth.add_auth`` takes the time from the clock; ours takes it from the
  variable, and is otherwise the same steps, checked against botocore by :func:`self_check`);
* the model checker's in-memory DynamoDB reads it to refuse a late request as DynamoDB would.

botocore's ``SigV4Auth`` internals are used here, so ``setup.cfg`` bounds botocore below 2.0 and
:func:`self_check` (run by the tests, and once when a client is first given the handler) refuses a
botocore whose SigV4 steps no longer produce botocore's own signature.
"""

from __future__ import annotations

import contextvars
import datetime
import threading

import botocore.auth
from botocore.auth import SIGV4_TIMESTAMP, SigV4Auth
from botocore.exceptions import NoCredentialsError

from reshard import errors

#: The epoch seconds the attempt in flight on this thread must be signed with (None: now).
SIGN_DATE: contextvars.ContextVar[float | None] = contextvars.ContextVar("reshard_sign_date", default=None)

AUTH_NAME = "reshard-v4"


class DatedSigV4Auth(SigV4Auth):
    """botocore's SigV4, dated :data:`SIGN_DATE` when it is set."""

    def add_auth(self, request):
        when = SIGN_DATE.get()
        if when is None:
            return super().add_auth(request)
        if self.credentials is None:
            raise NoCredentialsError()
        request.context["timestamp"] = datetime.datetime.fromtimestamp(
            when, datetime.timezone.utc).strftime(SIGV4_TIMESTAMP)
        # The rest is SigV4Auth.add_auth after its clock read (botocore 1.3x-1.4x).
        self._modify_request_before_signing(request)
        canonical_request = self.canonical_request(request)
        string_to_sign = self.string_to_sign(request, canonical_request)
        signature = self.signature(string_to_sign, request)
        self._inject_signature_to_request(request, signature)


_checked: list[bool] = []
_check_lock = threading.Lock()


def self_check() -> None:
    """Refuse (BadInput) a botocore whose SigV4 our dated signer no longer reproduces."""
    with _check_lock:
        if _checked:
            if not _checked[0]:
                raise errors.BadInput(_MISMATCH)
            return
        from unittest import mock
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        creds = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "token")
        fixed = datetime.datetime(2026, 11, 27, 19, 30, 0, tzinfo=datetime.timezone.utc)

        def signed(auth_cls, dated: bool) -> dict:
            req = AWSRequest("POST", "https://dynamodb.us-east-1.amazonaws.com/", data=b'{"TableName":"t"}',
                             headers={"Content-Type": "application/x-amz-json-1.0",
                                      "X-Amz-Target": "DynamoDB_20120810.GetItem"})
            auth = auth_cls(creds, "dynamodb", "us-east-1")
            if dated:
                token = SIGN_DATE.set(fixed.timestamp())
                try:
                    auth.add_auth(req)
                finally:
                    SIGN_DATE.reset(token)
            else:
                with mock.patch.object(botocore.auth, "get_current_datetime", return_value=fixed):
                    auth.add_auth(req)
            return {k: req.headers.get(k) for k in ("X-Amz-Date", "Authorization", "X-Amz-Security-Token")}

        try:
            ok = signed(DatedSigV4Auth, True) == signed(SigV4Auth, False)
        except Exception:  # noqa: BLE001 - any failure means we do not recognise this botocore
            ok = False
        _checked.append(ok)
        if not ok:
            raise errors.BadInput(_MISMATCH)


_MISMATCH = ("this botocore's SigV4 signer differs from the one reshard's dated signer reproduces "
             "(reshard/aws/signing.py); install a botocore release setup.cfg allows")


def _choose(signature_version=None, **_):
    if SIGN_DATE.get() is not None and signature_version == "v4":
        return AUTH_NAME
    return None


def install(client) -> None:
    """Let ``client`` sign with :data:`SIGN_DATE` (idempotent)."""
    self_check()
    botocore.auth.AUTH_TYPE_MAPS.setdefault(AUTH_NAME, DatedSigV4Auth)
    events = client.meta.events
    events.register("choose-signer.dynamodb", _choose, unique_id="reshard-dated-signer")
