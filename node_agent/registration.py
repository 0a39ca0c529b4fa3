"""Registration with the registrar and AK activation (ARCHITECTURE
"Flows" 3; keylime's registrar protocol with TPM2_MakeCredential /
TPM2_ActivateCredential).

Without ``[agent] cert_file`` the agent registers with no client
certificate: its identity is its TPM (the registrar checks the EK
certificate against its EK anchors). Either way the registrar's
certificate and host name are checked against the operator CA.
"""

from __future__ import annotations

import dataclasses
import ssl
from typing import Any

from node_agent.exceptions import BootstrapError, RegistrationError
from verifier.common.errors import TransportError
from verifier.common.http import AsyncClient
from verifier.common.tls import client_context
from verifier.common.tpm_access import TpmAccess, TpmLike
from verifier.protocol import MalformedError, TpmPublic
from verifier.protocol.messages.registration import (
    ActivationChallenge,
    ActivationProof,
    ActivationResult,
    RegistrationRequest,
)

__all__ = ["Contact", "register"]

_HTTP_TIMEOUT = 30.0


@dataclasses.dataclass(frozen=True)
class Contact:
    """Who registers, where, and with which credentials.

    Attributes:
        uuid: the node UUID.
        registrar_url: base URL of the registrar (None: not configured).
        ca_file: the operator CA (trusts the registrar's certificate).
        cert_file: client certificate (None: register by the TPM alone).
        key_file: its key.
        tls_cert_pem: the agent's own TLS certificate (pinned by others).
        host: the address registered for verifiers and tenants.
        port: the port registered.
    """

    uuid: str
    registrar_url: str | None
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    tls_cert_pem: bytes
    host: str
    port: int


def client_ssl_context(contact: Contact) -> ssl.SSLContext | None:
    """The TLS context towards the registrar (None for plain http).

    Raises:
        BootstrapError: no CA for an https registrar, cert_file without
            key_file (or the reverse), or files that cannot be loaded.
    """
    url = contact.registrar_url or ""
    if not url.startswith("https:"):
        return None
    if not contact.ca_file:
        raise BootstrapError(
            "[agent] ca_file (or the ca_pem of the bootstrap file) is "
            "required for an https registrar"
        )
    if bool(contact.cert_file) != bool(contact.key_file):
        raise BootstrapError("[agent] cert_file and key_file go together")
    try:
        return client_context(contact.cert_file, contact.key_file, contact.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise BootstrapError(f"cannot load the agent's TLS credentials: {exc}")


async def _post(
    http: AsyncClient, contact: Contact, url: str, body: dict[str, Any]
) -> dict[str, Any]:
    try:
        answer = await http.request("POST", url, json=body)
    except TransportError as exc:
        raise RegistrationError(
            f"registrar {contact.registrar_url} unreachable: {exc}", retryable=True
        )
    if not answer.ok:
        error = answer.error
        message = f"{error.code}: {error.message}" if error.code else error.message
        raise RegistrationError(
            f"registrar answered {answer.status} to {url}: {message}",
            retryable=answer.status >= 500,
        )
    if not isinstance(answer.data, dict):
        raise RegistrationError(f"registrar answered {url} with non-JSON")
    return answer.data


async def register(contact: Contact, tpm: TpmAccess) -> None:
    """Register EK, EK cert, AK, TLS cert and address; activate the AK.

    Raises:
        BootstrapError: the registrar or its CA is not configured.
        RegistrationError: the registrar is unreachable or refused.
        TpmError: the TPM failed.
    """
    if not contact.registrar_url:
        raise BootstrapError("[agent] registrar_url is not set")
    context = client_ssl_context(contact)

    def identity(tpm: TpmLike) -> tuple[bytes, bytes | None, bytes]:
        return tpm.ek_public(), tpm.ek_certificate(), tpm.ak_public()

    ek_public, ek_cert, ak_public = await tpm.run(identity)
    url = f"{contact.registrar_url}/v1/agents/{contact.uuid}"
    try:
        body = RegistrationRequest(
            ek_public=TpmPublic.from_bytes(ek_public),
            ek_certificate=ek_cert or None,
            ak_public=TpmPublic.from_bytes(ak_public),
            tls_cert=contact.tls_cert_pem.decode(),
            host=contact.host,
            port=contact.port,
        )
    except MalformedError as exc:
        raise RegistrationError(f"cannot register: {exc}")
    async with AsyncClient(context, _HTTP_TIMEOUT) as http:
        answer = await _post(http, contact, url, body.to_dict())
        try:
            challenge = ActivationChallenge.from_dict(answer)
        except MalformedError as exc:
            raise RegistrationError(f"registrar sent a malformed challenge: {exc}")
        credential = await tpm.run(
            lambda t: t.activate_credential(
                challenge.credential_blob, challenge.encrypted_secret
            )
        )
        proof = ActivationProof(credential)
        result = await _post(http, contact, f"{url}/activate", proof.to_dict())
    try:
        activated = ActivationResult.from_dict(result)
    except MalformedError as exc:
        raise RegistrationError(f"registrar sent a malformed answer: {exc}")
    if activated.uuid != contact.uuid or not activated.activated:
        raise RegistrationError("registrar did not confirm AK activation")
