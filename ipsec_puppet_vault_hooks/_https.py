"""A small JSON-over-HTTPS client (standard library only) for the plugins.

Plugins run synchronously inside the consumer's worker, and the autosign
executable is a short-lived process, so a blocking client is enough; each
call opens one connection with mutual TLS.
"""

from __future__ import annotations

import dataclasses
import json
import ssl
import urllib.error
import urllib.request
from typing import Any

__all__ = ["HttpResponse", "TransportError", "client_context", "request"]


class TransportError(Exception):
    """The server could not be reached or did not answer (no HTTP status)."""


@dataclasses.dataclass(frozen=True)
class HttpResponse:
    """An HTTP answer of any status."""

    status: int
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON (None when it is not JSON)."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def text(self, limit: int = 300) -> str:
        """The start of the body, for error messages."""
        return self.body[:limit].decode("utf-8", "replace").strip()


def client_context(
    cert_file: str | None, key_file: str | None, ca_file: str | None
) -> ssl.SSLContext:
    """A TLS client context trusting ``ca_file`` (system CAs when None) and
    presenting ``cert_file``/``key_file`` when given."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


def request(
    method: str,
    url: str,
    context: ssl.SSLContext,
    *,
    body: object = None,
    timeout: float = 10.0,
    headers: dict[str, str] | None = None,
) -> HttpResponse:
    """Send one request; return the answer whatever its status.

    Args:
        method: HTTP method.
        url: absolute ``https://`` URL.
        context: TLS client context.
        body: sent as JSON when not None.
        timeout: seconds for connecting and for each read.
        headers: extra request headers.

    Raises:
        TransportError: connection refused, TLS failure, timeout, ...
    """
    if not url.startswith("https://"):
        raise TransportError(f"refusing a non-HTTPS URL: {url}")
    data = None
    all_headers = {"Accept": "application/json", **(headers or {})}
    if body is not None:
        data = json.dumps(body).encode()
        all_headers["Content-Type"] = "application/json"
    req = urllib.request.Request(  # noqa: S310 (HTTPS checked above)
        url, data=data, method=method, headers=all_headers
    )
    try:
        with urllib.request.urlopen(  # noqa: S310 (HTTPS checked above)
            req, context=context, timeout=timeout
        ) as resp:
            return HttpResponse(resp.status, resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return HttpResponse(exc.code, exc.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TransportError(f"{method} {url}: {reason}") from exc
