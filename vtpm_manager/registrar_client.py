"""The provider's side of the registrar API: ``/v1/agents/{uuid}/ek``,
``/v1/provider/hosts/{host}`` and ``/v1/provider/instances/{uuid}``.

Synchronous (the manager runs from a CLI or a libvirt hook), over mTLS with
the compute host's ``provider`` certificate. Transport failures and 5xx
answers are retried with exponential backoff; a 4xx answer is final.
"""

from __future__ import annotations

import ssl
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from verifier.common.errors import TransportError
from verifier.common.http import BlockingClient
from verifier.protocol import TpmPublic
from verifier.protocol.messages.provider import (
    HostCaEnrolment,
    InstancePlacement,
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
        self._base = url.rstrip("/")
        self._host = parsed.hostname
        self._port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self._http = BlockingClient(ssl_context, timeout)
        self._retries = retries
        self._backoff = backoff
        self._sleep = sleep
        self.delays: list[float] = []

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
                answer = self._http.request(method, self._base + path, json=body)
            except TransportError as exc:
                last = str(exc)
                continue
            if answer.status >= 500:
                last = f"HTTP {answer.status}"
                continue
            if answer.status >= 400:
                error = answer.error
                code = error.code or "error"
                cls = (
                    EkConflictError
                    if answer.status == 409 and "ek" in code
                    else RegistrationRefusedError
                )
                raise cls(answer.status, code, error.message)
            data = answer.data if isinstance(answer.data, dict) else {}
            return answer.status, data
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

    # -- host-bound vTPMs (Nova's own) --------------------------------------

    def enrol_host(self, host: str, ca_pem: str) -> bool:
        """Enrol (or replace) ``host``'s swtpm local CA; True if new.

        Raises:
            RegistrationRefusedError: refused (``bad_host_ca``, forbidden).
            RegistrarUnavailableError: unreachable after the retries.
        """
        path = f"/v1/provider/hosts/{urllib.parse.quote(host, safe='')}"
        status, _ = self._call("PUT", path, HostCaEnrolment(ca_pem).to_dict())
        return status == 201

    def host_enrolled(self, host: str) -> bool:
        """Whether ``host`` has an enrolled CA.

        Raises:
            RegistrationRefusedError: a refusal other than 404.
            RegistrarUnavailableError: unreachable after the retries.
        """
        path = f"/v1/provider/hosts/{urllib.parse.quote(host, safe='')}"
        try:
            self._call("GET", path)
        except RegistrationRefusedError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def unenrol_host(self, host: str) -> bool:
        """Remove ``host``'s CA; False if none was enrolled."""
        path = f"/v1/provider/hosts/{urllib.parse.quote(host, safe='')}"
        return self._delete(path)

    def place(self, instance_uuid: str, host: str) -> bool:
        """Record that Nova runs the instance on ``host``; True if new."""
        path = f"/v1/provider/instances/{instance_uuid}"
        status, _ = self._call("PUT", path, InstancePlacement(host).to_dict())
        return status == 201

    def unplace(self, instance_uuid: str) -> bool:
        """Forget the instance's placement; False if none was recorded."""
        return self._delete(f"/v1/provider/instances/{instance_uuid}")

    def _delete(self, path: str) -> bool:
        try:
            self._call("DELETE", path)
        except RegistrationRefusedError as exc:
            if exc.status == 404:
                return False
            raise
        return True
