"""What the servers say about certificates: a client certificate refused
in the TLS handshake, and their own certificate expired or expiring.

A handshake that fails on the server side reaches no handler, and
neither asyncio nor uvloop reports it (outside their debug mode): a client
whose certificate has expired sees ``Connection reset by peer`` and the
service logs nothing (issue 33). :func:`log_refusals` gives a server
context an :class:`ssl.SSLObject` class that logs each refusal once, with
why (OpenSSL's verification message: ``certificate has expired``,
``unable to get local issuer certificate``, ...). Python's :mod:`ssl`
hands over no certificate of a handshake that failed (no verify callback,
no unverified chain before Python 3.13), so the line cannot name the
certificate's subject; it never carries key material.

On the client side, TLS 1.3 ends the handshake before the server has
judged the client's certificate: a refused one shows as the server closing
the connection on the first read (``connection closed by the peer``,
``EOF occurred in violation of protocol``) or, when the alert gets through,
an ``SSLV3_ALERT_CERTIFICATE_EXPIRED``-like error.
:func:`remember_client_certificate` records which certificate file a
client context presents and :func:`refusal_hint` turns such a failure into
a sentence saying the server may have refused that certificate, and that
it has expired (or is not valid yet) when its dates say so.
"""

from __future__ import annotations

import datetime
import logging
import ssl
import weakref

from cryptography import x509

__all__ = [
    "EXPIRY_WARNING_DAYS",
    "log_refusals",
    "refusal_hint",
    "remember_client_certificate",
    "warn_if_expiring",
]

LOG = logging.getLogger("verifier.common.tls")

#: A service warns at start about a certificate expiring within this many days.
EXPIRY_WARNING_DAYS = 30


def _why(exc: ssl.SSLError) -> str | None:
    """Why the client's certificate was refused, or None if the handshake
    failed for another reason (e.g. the client hung up)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"{exc.verify_message} (verify code {exc.verify_code})"
    if exc.reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
        return "no client certificate"
    return None


class _RefusalLoggingSSLObject(ssl.SSLObject):
    """An :class:`ssl.SSLObject` that logs a refused client certificate."""

    def do_handshake(self) -> None:
        try:
            super().do_handshake()
        except ssl.SSLWantReadError:
            raise
        except ssl.SSLError as exc:
            why = _why(exc)
            if why is not None:
                LOG.warning(
                    "Refused a client certificate in the TLS handshake: %s", why
                )
            raise


def log_refusals(ctx: ssl.SSLContext) -> None:
    """Log each client certificate ``ctx`` refuses, once, with why (for
    servers on asyncio or uvloop, which wrap TLS in ``ctx.wrap_bio``)."""
    ctx.sslobject_class = _RefusalLoggingSSLObject


def warn_if_expiring(
    path: str,
    pem: bytes,
    now: datetime.datetime | None = None,
    days: int = EXPIRY_WARNING_DAYS,
) -> None:
    """Log a WARNING naming ``path`` and the date if the certificate
    ``pem`` (its first) has expired, is not valid yet, or expires within
    ``days``. A file that does not parse is left to the TLS library."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError:
        return
    now = now or datetime.datetime.now(datetime.UTC)
    end = cert.not_valid_after_utc
    start = cert.not_valid_before_utc
    if end <= now:
        LOG.warning(
            "Certificate %s expired on %s: clients refuse it; renew it",
            path,
            end.isoformat(),
        )
    elif start > now:
        LOG.warning(
            "Certificate %s is not valid before %s: clients refuse it until then",
            path,
            start.isoformat(),
        )
    elif end - now <= datetime.timedelta(days=days):
        LOG.warning(
            "Certificate %s expires on %s (in %d days): renew it",
            path,
            end.isoformat(),
            (end - now).days,
        )


#: Client context -> the certificate file it presents.
_CLIENT_CERTIFICATES: weakref.WeakKeyDictionary[ssl.SSLContext, str] = (
    weakref.WeakKeyDictionary()
)
#: Alerts a server sends about the client's certificate (OpenSSL reasons).
_CERTIFICATE_ALERTS = (
    "ALERT_CERTIFICATE_EXPIRED",
    "ALERT_BAD_CERTIFICATE",
    "ALERT_UNKNOWN_CA",
    "ALERT_CERTIFICATE_REQUIRED",
    "ALERT_CERTIFICATE_UNKNOWN",
    "ALERT_CERTIFICATE_REVOKED",
    "ALERT_UNSUPPORTED_CERTIFICATE",
)


def remember_client_certificate(ctx: ssl.SSLContext, cert_file: str) -> None:
    """Record that ``ctx`` presents the certificate in ``cert_file``."""
    _CLIENT_CERTIFICATES[ctx] = cert_file


def _looks_refused(exc: BaseException) -> bool:
    """Whether ``exc`` is how a refused client certificate shows on the
    client: an alert about it, or the server closing the connection."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return False  # we refused the server, not the other way round
    if isinstance(exc, ssl.SSLEOFError | ConnectionResetError | BrokenPipeError):
        return True
    reason = getattr(exc, "reason", None)
    return isinstance(exc, ssl.SSLError) and any(
        alert in str(reason) for alert in _CERTIFICATE_ALERTS
    )


def refusal_hint(
    ctx: ssl.SSLContext | None,
    exc: BaseException,
    now: datetime.datetime | None = None,
) -> str:
    """A sentence on the client certificate that the server may have
    refused, or '' if ``ctx`` presents none or ``exc`` is not a failure
    a refusal causes. Names the file and, read from it, whether it has
    expired or is not valid yet."""
    cert_file = _CLIENT_CERTIFICATES.get(ctx) if ctx is not None else None
    if cert_file is None or not _looks_refused(exc):
        return ""
    try:
        with open(cert_file, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
    except (OSError, ValueError):
        return f"the server may have refused our client certificate {cert_file}"
    now = now or datetime.datetime.now(datetime.UTC)
    end, start = cert.not_valid_after_utc, cert.not_valid_before_utc
    if end <= now:
        return (
            f"the server refused our client certificate {cert_file}: it expired "
            f"on {end.isoformat()} (renew it)"
        )
    if start > now:
        return (
            f"the server refused our client certificate {cert_file}: it is not "
            f"valid before {start.isoformat()}"
        )
    return (
        f"the server may have refused our client certificate {cert_file} "
        f"(valid until {end.isoformat()}; another CA's, or revoked?)"
    )
