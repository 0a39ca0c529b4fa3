"""Trusted boot through Nova: the logic behind ``trusted-nova boot`` and
``openstack trusted server create`` (both are thin layers over this).

1. Seal the payload under a fresh key K, bound to a fresh boot id, and
   build cloud-init user-data (:mod:`nova_plugin.userdata`); Nova only
   sees ciphertext.
2. Create the server(s) with novaclient over a keystoneauth session.
3. For each instance UUID, split K = U xor V afresh and enrol the UUID
   with the verifier ahead of its instance (V and the policy; the verifier
   waits for Nova's ``instance.create.end`` and the agent's AK).
4. With ``wait``: as each agent activates its AK, check its identity
   quote and send it U with the payload envelope; then wait until the
   verifier attested it and released V.

After a server exists, any failure deletes the enrolments this boot made
and the servers it created, and the error says exactly what is left.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid as uuid_mod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nova_plugin import userdata
from nova_plugin.exceptions import AgentError, ServiceError, TenantError
from nova_plugin.tenant import Tenant
from verifier.protocol import (
    MalformedError,
    PcrPolicy,
    canonical_uuid,
    generate_key,
    seal_payload,
    split,
)
from verifier.protocol.attestation import AttestationMode
from verifier.protocol.enroller import commit_u
from verifier.protocol.messages.registration import RegistrationRecord

__all__ = [
    "BootFailedError",
    "BootResult",
    "NovaRefusedError",
    "ServerSpec",
    "TrustedBoot",
    "prepare_user_data",
]

Progress = Callable[[str], None]


class NovaRefusedError(TenantError):
    """Nova refused the request: no server was created."""


class BootFailedError(TenantError):
    """A step after the server(s) existed failed; the message says what
    was undone and what is left."""


@dataclasses.dataclass(frozen=True)
class ServerSpec:
    """What ``nova boot`` is given (besides the user-data)."""

    name: str
    image: str
    flavor: str
    min_count: int = 1
    max_count: int | None = None
    key_name: str | None = None
    availability_zone: str | None = None
    security_groups: tuple[str, ...] = ()
    nics: Any = None
    meta: Mapping[str, str] = dataclasses.field(default_factory=dict)
    config_drive: bool = False


@dataclasses.dataclass
class ServerState:
    """One server of this boot and how far it got."""

    id: str
    name: str
    enrolled: bool = False
    bootstrapped: bool = False
    state: str = "created"


@dataclasses.dataclass
class BootResult:
    boot_id: str
    user_data_bytes: int
    servers: list[ServerState]


def prepare_user_data(
    payload: bytes,
    registrar_url: str,
    ca_pem: str | None,
    push_url: str | None = None,
) -> tuple[bytes, bytes, str, bytes]:
    """Seal ``payload`` and build the user-data (``push_url``: the
    verifier's push endpoint, for a node booted in push mode).

    Returns:
        (K, sealed envelope, boot id, user-data).

    Raises:
        UserDataTooLargeError: over Nova's limit after compression.
        TenantError: ``registrar_url``, ``ca_pem`` or ``push_url`` is not
            what it names.
    """
    key = generate_key()
    boot_id = str(uuid_mod.uuid4())
    sealed = seal_payload(key, userdata.compress_payload(payload), boot_id)
    try:
        config = userdata.BootstrapConfig(boot_id, registrar_url, ca_pem, push_url)
    except MalformedError as exc:
        raise TenantError(f"cannot build the guest's bootstrap configuration: {exc}")
    return key, sealed, boot_id, userdata.build_user_data(config, sealed)


def _nova_message(exc: Exception) -> str:
    code = getattr(exc, "code", None)
    message = getattr(exc, "message", None) or str(exc)
    return f"{message} (HTTP {code})" if isinstance(code, int) else str(message)


class TrustedBoot:
    """One trusted boot request.

    Args:
        nova: a novaclient ``Client`` (over a keystoneauth session).
        tenant: the tenant library client (registrar and verifier).
        policy: the PCR policy the verifier enforces.
        registrar_url: written into the guest's bootstrap configuration.
        ca_pem: the operator CA certificate for the guest (optional).
        progress: receives one line per step (the CLI's indicator).
        mode: ``pull`` or ``push`` (the agent posts its evidence and opens
            no port); the identity quote and U go through the verifier's
            relay either way.
        push_url: the verifier's push endpoint, written into the guest's
            bootstrap configuration in push mode (None: the image's or the
            provider's vendor-data configuration names it).
    """

    def __init__(
        self,
        nova: Any,
        tenant: Tenant,
        policy: PcrPolicy,
        registrar_url: str,
        ca_pem: str | None = None,
        progress: Progress | None = None,
        mode: AttestationMode = AttestationMode.PULL,
        push_url: str | None = None,
        stored: tuple[str | None, str | None] = (None, None),
    ) -> None:
        """``stored``: the names of a runtime (IMA) and a measured-boot
        policy stored with the verifier, each checked with every quote."""
        self._mode = mode = AttestationMode(mode)
        self._push_url = push_url if mode is AttestationMode.PUSH else None
        self._stored = stored
        self._nova = nova
        self._tenant = tenant
        self._policy = policy
        self._registrar_url = registrar_url
        self._ca_pem = ca_pem
        self._progress = progress or (lambda line: None)
        self._u: dict[str, bytes] = {}

    async def boot(
        self, spec: ServerSpec, payload: bytes, wait: bool, timeout: float = 600.0
    ) -> BootResult:
        """Create, enrol and (with ``wait``) bootstrap the server(s).

        Raises:
            UserDataTooLargeError: nothing was created.
            NovaRefusedError: nothing was created.
            BootFailedError: the message says what is left.
        """
        key, sealed, boot_id, user_data = prepare_user_data(
            payload, self._registrar_url, self._ca_pem, self._push_url
        )
        self._progress(
            f"payload sealed ({len(payload):,} bytes, user-data "
            f"{len(user_data):,} of {userdata.MAX_USER_DATA_BYTES:,} bytes)"
        )
        servers = await asyncio.to_thread(self._create, spec, user_data)
        self._progress(f"Nova accepted {len(servers)} server(s)")
        result = BootResult(boot_id, len(user_data), servers)
        try:
            await self.enrol(servers, key)
            if wait:
                await self.bootstrap(servers, sealed, boot_id, timeout)
        except (Exception, asyncio.CancelledError) as exc:
            # whatever stopped us (a refusal, a timeout, a client error,
            # Ctrl-C), nothing of this boot stays behind unannounced
            cause = exc if str(exc) else type(exc).__name__
            raise BootFailedError(await self._undo(servers, cause))
        return result

    # -- Nova ------------------------------------------------------------

    def _create(self, spec: ServerSpec, user_data: bytes) -> list[ServerState]:
        from novaclient import exceptions as nova_exc

        kwargs: dict[str, Any] = {
            "userdata": user_data,
            "min_count": spec.min_count,
            "max_count": spec.max_count or spec.min_count,
            "meta": dict(spec.meta) or None,
            "key_name": spec.key_name,
            "availability_zone": spec.availability_zone,
            "security_groups": list(spec.security_groups) or None,
            "config_drive": spec.config_drive or None,
            "nics": spec.nics,
            "reservation_id": True,  # answer with the reservation id
        }
        try:
            flavor = self._find_flavor(spec.flavor)
            reservation = self._nova.servers.create(
                spec.name, spec.image, flavor, **kwargs
            )
        except nova_exc.ClientException as exc:
            raise NovaRefusedError(
                f"Nova refused to create the server: {_nova_message(exc)}; "
                "no server was created and nothing was enrolled"
            )
        rid = str(getattr(reservation, "reservation_id", reservation))
        found = self._nova.servers.list(search_opts={"reservation_id": rid})
        if not found:
            raise BootFailedError(
                f"Nova accepted the request (reservation {rid}) but lists no "
                f"server for it; check 'openstack server list --reservation-id "
                f"{rid}' and delete what is there: nothing was enrolled"
            )
        return [ServerState(s.id, s.name) for s in found]

    def _find_flavor(self, ref: str) -> Any:
        from novaclient import exceptions as nova_exc

        try:
            return self._nova.flavors.get(ref)
        except nova_exc.NotFound:
            pass
        matches = [f for f in self._nova.flavors.list() if f.name == ref]
        if len(matches) != 1:
            raise nova_exc.NotFound(404, f"Flavor {ref!r} could not be found.")
        return matches[0]

    # -- verifier --------------------------------------------------------

    async def enrol(self, servers: Sequence[ServerState], key: bytes) -> None:
        """Enrol each server's UUID with a fresh split of ``key``.

        Raises:
            ServiceError: the verifier refused or is unreachable (servers
                enrolled before stay marked ``enrolled`` for the undo).
        """
        for server in servers:
            u_share, v_share = split(key)
            try:
                await self._tenant.enrol_ahead(
                    server.id,
                    v_share,
                    self._policy,
                    commit_u(canonical_uuid(server.id), u_share),
                    mode=self._mode,
                    runtime_policy=self._stored[0],
                    mb_policy=self._stored[1],
                )
            except ServiceError as exc:
                if exc.code == "already_enrolled":
                    raise ServiceError(
                        f"instance {server.id} is already enrolled with the "
                        "verifier by someone else; that enrolment was left "
                        "as it is",
                        exc.status,
                        exc.code,
                    )
                raise
            server.enrolled = True
            self._u[server.id] = u_share
            self._progress(f"{server.id}: enrolled with the verifier")

    async def bootstrap(
        self,
        servers: Sequence[ServerState],
        sealed: bytes,
        boot_id: str,
        timeout: float,
    ) -> None:
        """Send U to each agent after its identity quote; wait until the
        verifier attested each node.

        Raises:
            TimeoutError: not all done in ``timeout`` seconds.
            TenantError: a node failed its identity quote, was revoked, or
                its server went into ERROR.
        """
        deadline = time.monotonic() + timeout
        await asyncio.gather(
            *(self._bootstrap_one(s, sealed, boot_id, deadline) for s in servers)
        )

    async def _bootstrap_one(
        self, server: ServerState, sealed: bytes, boot_id: str, deadline: float
    ) -> None:
        uuid = server.id
        record = await self._poll(
            lambda: self._activated(server), deadline, f"{uuid}: agent registration"
        )
        self._progress(f"{uuid}: agent registered; checking its identity quote")
        nk = await self._tenant.check_identity_quote(
            uuid, record, self._policy, self._mode
        )
        try:
            # U alone: the node has the sealed payload (bound to boot_id)
            # from its user-data.
            await self._tenant.send_u(
                uuid, record, nk, self._u[uuid], None, mode=self._mode
            )
        except AgentError as exc:
            raise ServiceError(f"sending U to {uuid} failed: {exc}")
        self._progress(f"{uuid}: U sent; waiting for the verifier's first quote")
        await self._poll(lambda: self._attested(uuid), deadline, f"{uuid}: attestation")
        server.bootstrapped = True
        server.state = "attested"
        self._progress(f"{uuid}: attested, V released, payload delivered")

    async def _activated(self, server: ServerState) -> RegistrationRecord | None:
        srv = await asyncio.to_thread(self._nova.servers.get, server.id)
        if srv.status == "ERROR":
            fault = getattr(srv, "fault", {}) or {}
            raise TenantError(
                f"server {server.id} went into ERROR: "
                f"{fault.get('message', 'no fault recorded')}"
            )
        return await self._tenant.activated_record(server.id)

    async def _attested(self, uuid: str) -> bool:
        node = await self._tenant.status(uuid)
        if node["state"] == "revoked":
            raise TenantError(f"node {uuid} was revoked: {node.get('failure_reason')}")
        return bool(node["state"] == "attested")

    async def _poll(self, check: Any, deadline: float, what: str) -> Any:
        delay = 0.2
        while True:
            value = await check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 2.0)

    # -- undo ------------------------------------------------------------

    async def _undo(
        self, servers: Sequence[ServerState], cause: BaseException | str
    ) -> str:
        """Delete this boot's enrolments and servers; describe what is left."""
        lines = [f"trusted boot failed: {cause}"]
        for server in servers:
            parts = [f"server {server.id} ({server.name}) was created"]
            if server.enrolled:
                try:
                    await self._tenant.delete(server.id)
                    parts.append("its enrolment was removed")
                except ServiceError as exc:
                    parts.append(
                        f"removing its enrolment failed ({exc}): the verifier "
                        f"still holds V for it; run 'trusted-tenant delete "
                        f"{server.id}'"
                    )
            else:
                parts.append("it was not enrolled")
            try:
                await asyncio.to_thread(self._nova.servers.delete, server.id)
                parts.append("it was deleted again")
            except Exception as exc:  # any client failure: say so, go on
                parts.append(
                    f"deleting it failed ({_nova_message(exc)}): it still "
                    f"exists; run 'openstack server delete {server.id}'"
                )
            lines.append("; ".join(parts))
        return "\n".join(lines)
