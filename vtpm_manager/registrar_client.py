"""The provider's side of the registrar API: ``/v1/agents/{uuid}/ek``.

Synchronous (the manager runs from a CLI or a libvirt hook), over mTLS with
the compute host's ``provider`` certificate. Transport failures and 5xx
answers are retried with exponential backoff; a 4xx answer is final.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from verifier.protocol import TpmPublic
from verifier.protocol.messages.provider import (
    ProviderEkRecord,
    ProviderEkRegistration,
    ProviderEkResult,
)
from vtpm_manager.exceptions import (
    EkConflictError,
    RegistrarUnavailableError,
    RegistrationRefusedError,
)
from vtpm_manager.identity import EkIdentity

__all__ = ["ProviderRegistrarClient"]


class ProviderRegistrarClient:
    """Registers vTPM EKs under instance UUIDs.

    Args:
        url: the registrar's base URL, ``https://host:port``.
        ssl_context: client context (None for plain http in tests).
        retries: attempts after the first one on transport errors and 5xx.
        backoff: the first delay in seconds; it doubles per attempt.
        timeout: per-request timeout in seconds.
        sleep: the sleep function (tests may record the delays).
    """

    def __init__(
        self,
        url: str,
        ssl_context: ssl.SSLContext | None = None,
        retries: int = 4,
        backoff: float = 0.5,
        timeout: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"bad registrar URL {url!r}")
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname
        self._port = parsed.port or (443 if self._https else 80)
        self._ssl = ssl_context
        self._retries = retries
        self._backoff = backoff
        self._timeout = timeout
        self._sleep = sleep
        self.delays: list[float] = []

    def _once(
        self, method: str, path: str, body: dict[str, Any] | None
    ) -> tuple[int, dict[str, Any]]:
        conn: http.client.HTTPConnection
        if self._https:
            conn = http.client.HTTPSConnection(
                self._host, self._port, timeout=self._timeout, context=self._ssl
            )
        else:
            conn = http.client.HTTPConnection(
                self._host, self._port, timeout=self._timeout
            )
        try:
            payload = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if payload else {}
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {}
        return resp.status, data if isinstance(data, dict) else {}

    def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        delay = self._backoff
        last = ""
        for attempt in range(self._retries + 1):
            if attempt:
                self.delays.append(delay)
                self._sleep(delay)
                delay *= 2
            try:
                status, data = self._once(method, path, body)
            except (OSError, http.client.HTTPException) as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if status >= 500:
                last = f"HTTP {status}"
                continue
            if status >= 400:
                error = data.get("error") or {}
                code = str(error.get("code", "error"))
                message = str(error.get("message", f"HTTP {status}"))
                cls = (
                    EkConflictError
                    if status == 409 and "ek" in code
                    else RegistrationRefusedError
                )
                raise cls(status, code, message)
            return status, data
        raise RegistrarUnavailableError(
            f"registrar at {self._host}:{self._port} unreachable after "
            f"{self._retries + 1} attempts ({last})"
        )

    def register_ek(self, instance_uuid: str, ek: EkIdentity) -> bool:
        """Register a vTPM EK; True if new, False if it already was.

        Raises:
            EkConflictError: another EK is registered for the instance.
            RegistrationRefusedError: any other refusal (bad EK, forbidden).
            RegistrarUnavailableError: unreachable after the retries.
            MalformedError: ``ek`` is not a TPM2B_PUBLIC (nothing is sent),
                or the registrar's answer is malformed.
        """
        body = ProviderEkRegistration(
            TpmPublic.from_bytes(ek.ek_public), ek.ek_certificate or None
        )
        _, data = self._call("PUT", f"/v1/agents/{instance_uuid}/ek", body.to_dict())
        return ProviderEkResult.from_dict(data).created

    def get_ek(self, instance_uuid: str) -> EkIdentity | None:
        """The registered EK of an instance, or None.

        Raises:
            RegistrationRefusedError: a refusal other than 404.
            RegistrarUnavailableError: unreachable after the retries.
            MalformedError: the registrar's answer is malformed or names
                another instance.
        """
        try:
            _, data = self._call("GET", f"/v1/agents/{instance_uuid}/ek")
        except RegistrationRefusedError as exc:
            if exc.status == 404:
                return None
            raise
        record = ProviderEkRecord.from_dict(data)
        record.check_node(instance_uuid)
        return EkIdentity(record.ek_public.to_bytes(), record.ek_certificate)

    def deregister(self, instance_uuid: str) -> bool:
        """Forget the instance; False if it was not registered."""
        try:
            self._call("DELETE", f"/v1/agents/{instance_uuid}/ek")
        except RegistrationRefusedError as exc:
            if exc.status == 404:
                return False
            raise
        return True
