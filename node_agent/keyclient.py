"""The node's side of capabilities, group keys and filegroups.

A node asks the verifier for a capability (with the agent's operator
certificate; the verifier issues one only while the node is attested), then
shows it to the key service with its identity certificate (CN = node UUID,
issued by the verifier after the first good quote). For a group it keeps an
:class:`~verifier.protocol.lkh.LkhMember`, applies the signed rekey messages
in epoch order, and resyncs by joining again when it missed some.
"""

from __future__ import annotations

import ssl
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from node_agent.exceptions import NodeAgentError
from verifier.common.errors import TransportError
from verifier.common.http import AsyncClient
from verifier.common.tls import client_context
from verifier.protocol.lkh import LkhError, LkhMember, RekeyMessage, Welcome
from verifier.protocol.messages.capabilities import CapabilityGrant, CapabilityRequest
from verifier.protocol.messages.keyservice import (
    FilegroupState,
    RekeyLog,
    SecretRelease,
)
from verifier.protocol.regression import ReaderState

__all__ = ["GroupKey", "KeyClient", "KeyServiceError", "KeyServiceUnreachableError"]

_TIMEOUT = 10.0


class KeyServiceError(NodeAgentError):
    """The verifier or key service refused a request.

    Attributes:
        status: the HTTP status.
        code: the error code from the JSON body (e.g. ``capability_old_epoch``).
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code


class KeyServiceUnreachableError(NodeAgentError):
    """The verifier or key service could not be reached, or its answer was
    not usable (the message names the transport failure)."""


class GroupKey:
    """A node's membership of one LKH group."""

    def __init__(self, member: LkhMember) -> None:
        self.member = member

    @property
    def group(self) -> str:
        return self.member.group

    @property
    def key(self) -> bytes:
        return self.member.group_key()

    def derive(self, purpose: str, length: int = 32) -> bytes:
        """A key for one use of the group key (e.g. ``ipsec-psk`` for a
        tenant-wide IPsec pre-shared key), bound to the group and epoch so
        it changes with every rekey."""
        info = f"tc-lkh|{self.group}|{self.member.epoch}|{purpose}".encode()
        return HKDF(hashes.SHA256(), length, None, info).derive(self.key)


class KeyClient:
    """HTTP client of the verifier's capability route and the key service.

    Args:
        uuid: this node.
        verifier_url: where capabilities come from.
        keyservice_url: the key service.
        agent_cert: (cert, key) PEM files of the agent's operator certificate.
        identity_cert: (cert, key) PEM files of the node identity certificate.
        ca_file: the operator CA (it signs both services' certificates).
    """

    def __init__(
        self,
        uuid: str,
        verifier_url: str,
        keyservice_url: str,
        agent_cert: tuple[str, str],
        identity_cert: tuple[str, str],
        ca_file: str,
    ) -> None:
        self.uuid = uuid
        self._verifier = verifier_url.rstrip("/")
        self._keyservice = keyservice_url.rstrip("/")
        self._agent_ctx = client_context(*agent_cert, ca_file)
        self._identity_ctx = client_context(*identity_cert, ca_file)
        self._controller: ed25519.Ed25519PublicKey | None = None

    async def _call(
        self,
        ctx: ssl.SSLContext,
        method: str,
        url: str,
        token: str | None = None,
        body: Any = None,
        *,
        pem: bool = False,
    ) -> Any:
        """One call; the JSON answer (the text with ``pem``).

        Raises:
            KeyServiceError: a refusal (4xx/5xx).
            KeyServiceUnreachableError: no usable answer.
        """
        headers = {"Authorization": f"Capability {token}"} if token else {}
        try:
            async with AsyncClient(ctx, _TIMEOUT) as http:
                answer = await http.request(
                    method, url, json=body, headers=headers, expect_json=not pem
                )
        except TransportError as exc:
            raise KeyServiceUnreachableError(str(exc))
        if not answer.ok:
            error = answer.error
            raise KeyServiceError(answer.status, error.code or "error", error.message)
        if pem:
            return answer.body.decode("ascii", "replace")
        return answer.data

    async def capability(self, obj: str, rights: str) -> str:
        """A fresh capability token from the verifier.

        Raises:
            KeyServiceError: e.g. 409 ``not_attested``.
        """
        url = f"{self._verifier}/v1/nodes/{self.uuid}/capabilities"
        body = CapabilityRequest(obj, rights).to_dict()
        data = await self._call(self._agent_ctx, "POST", url, body=body)
        return CapabilityGrant.from_dict(data).token

    async def _ks(
        self, method: str, path: str, token: str | None = None, *, pem: bool = False
    ) -> Any:
        return await self._call(
            self._identity_ctx, method, self._keyservice + path, token, pem=pem
        )

    async def secret(self, name: str) -> bytes:
        """The secret ``name`` (a new read capability each time)."""
        token = await self.capability(f"secret:{name}", "r")
        data = await self._ks("GET", f"/v1/secrets/{name}", token)
        return SecretRelease.from_dict(data).secret

    async def _controller_key(self) -> ed25519.Ed25519PublicKey:
        if self._controller is None:
            pem = await self._ks("GET", "/v1/signing-key", pem=True)
            key = serialization.load_pem_public_key(pem.encode())
            if not isinstance(key, ed25519.Ed25519PublicKey):
                raise KeyServiceError(200, "bad_signing_key", "not Ed25519")
            self._controller = key
        return self._controller

    async def join(self, gid: str) -> GroupKey:
        """Join group ``gid`` (or resync) and catch up."""
        token = await self.capability(f"group:{gid}", "j")
        welcome = Welcome.from_dict(
            await self._ks("POST", f"/v1/groups/{gid}/join", token)
        )
        group = GroupKey(LkhMember(welcome, await self._controller_key()))
        await self.follow(group)
        return group

    async def follow(self, group: GroupKey) -> bytes:
        """Apply the rekey messages after our epoch; the group key.

        After a gap (or when the service dropped old messages) it joins
        again to resync.

        Raises:
            LkhError: ``evicted`` and other refusals of a message.
            KeyServiceError: a refused resync (e.g. the node was revoked).
        """
        member = group.member
        path = f"/v1/groups/{member.group}/rekey?since={member.epoch}"
        try:
            log = RekeyLog.from_dict(await self._ks("GET", path))
            for raw in log.messages:
                member.apply(RekeyMessage.from_bytes(raw))
        except (LkhError, KeyServiceError) as exc:
            if getattr(exc, "reason", getattr(exc, "code", "")) not in (
                "gap",
                "resync",
            ):
                raise
            token = await self.capability(f"group:{member.group}", "j")
            data = await self._ks("POST", f"/v1/groups/{member.group}/join", token)
            member.resync(Welcome.from_dict(data))
        return member.group_key()

    async def filegroup_state(self, fg: str) -> ReaderState:
        """The current key-regression state of filegroup ``fg``."""
        token = await self.capability(f"filegroup:{fg}", "r")
        data = await self._ks("GET", f"/v1/filegroups/{fg}/state", token)
        return FilegroupState.from_dict(data).reader_state()
