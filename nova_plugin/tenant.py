"""The tenant library: enrol a node with a payload and a policy.

The tenant keeps K. It checks the node's identity quote against the AK the
registrar activated, seals the payload under K for that node, sends V and
the policy to the verifier and U (sealed to the node's quoted transport
key) with the sealed payload to the node. Both the identity quote and U
go through the verifier's relay (:mod:`nova_plugin.relay`) in either
attestation mode, so the tenant needs no route to the node and no
certificate an agent would accept: only its Keystone session (or, in the
``noauth`` demo, the certificate that names its project). The quote is
checked here and U sealed here all the same; the verifier is trusted with
neither. ``TenantConfig.direct_agents`` keeps the older path for polled
nodes (the tenant's own mTLS connection to the agent, with a tenant
certificate the agent accepts). If anything fails after the verifier
accepted V, the enrolment is undone and the error says so.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, NoReturn
from urllib.parse import quote, urlencode

from nova_plugin.attestation import AttestationClient
from nova_plugin.direct import DirectAgents
from nova_plugin.event_filters import next_params
from nova_plugin.exceptions import (
    AgentError,
    AttestationFailedError,
    ServiceError,
    TenantError,
)
from nova_plugin.relay import PushRelay
from nova_plugin.services import ServiceClient
from verifier.common import tls as tlsutil
from verifier.protocol import (
    AttestationKey,
    EvidenceError,
    MalformedError,
    PcrPolicy,
    ShareKind,
    canonical_uuid,
    generate_key,
    seal_payload,
    seal_share,
    split,
)
from verifier.protocol.attestation import AttestationMode
from verifier.protocol.enroller import commit_u
from verifier.protocol.envelope import MAX_PAYLOAD_BYTES
from verifier.protocol.messages.enrolment import (
    EnrolmentRequest,
    PolicyChangeRequest,
    RevokeRequest,
)
from verifier.protocol.messages.event_query import MAX_LIMIT, EventQuery
from verifier.protocol.messages.policies import PolicyUpload
from verifier.protocol.messages.policy_check import (
    PolicyCheckReport,
    PolicyCheckRequest,
)
from verifier.protocol.messages.quote import QuoteRequest
from verifier.protocol.messages.registration import RegistrationRecord
from verifier.protocol.messages.shares import ShareAccepted, ShareU
from verifier.protocol.relay import check_identity_answer


@dataclasses.dataclass(frozen=True)
class TenantConfig:
    """Where the services are, and how the tenant reaches them.

    Attributes:
        cert_file, key_file: a tenant client certificate (None: none; the
            calls then go over the user's Keystone session).
        ca_file: the CAs the services' TLS certificates chain to.
        direct_agents: reach polled nodes' agents directly (their quote
            endpoint and ``/v1/keys/u``) with ``cert_file`` instead of the
            verifier's relay.
    """

    registrar_url: str
    verifier_url: str
    cert_file: str | None
    key_file: str | None
    ca_file: str | None
    timeout: float = 10.0
    direct_agents: bool = False


#: Seconds the verifier may take to answer a policy check (it quotes every
#: node checked, 16 at a time, each within a minute).
CHECK_TIMEOUT = 600.0


@dataclasses.dataclass(frozen=True)
class EnrolResult:
    uuid: str
    state: str
    pcrs: tuple[int, ...]


class Tenant:
    """Talks to the registrar and the verifier (and, only with
    ``direct_agents``, to polled nodes' agents).

    Args:
        config: where the services are, and the tenant certificate if any.
        verifier: the verifier on the user's Keystone session (found in
            the catalog); when given, every verifier call goes through it
            instead of mTLS (``config.verifier_url`` is then only a label).
        registrar: the registrar's read side on the user's Keystone
            session (``[registrar] auth_strategy = keystone``); when given,
            registrar calls go through it instead of mTLS.
    """

    def __init__(
        self,
        config: TenantConfig,
        verifier: AttestationClient | None = None,
        registrar: AttestationClient | None = None,
    ) -> None:
        self._config = config
        self._context = tlsutil.client_context(
            config.cert_file, config.key_file, config.ca_file
        )
        self._sessions = [
            (config.verifier_url, verifier),
            (config.registrar_url, registrar),
        ]
        self._services = ServiceClient(self._context, config.timeout, self._sessions)
        self._slow: ServiceClient | None = None  # the policy check's
        self._call = self._services.call
        self._relay = PushRelay(self._call, config.verifier_url)
        self._agents = DirectAgents(
            config.cert_file,
            config.key_file,
            config.timeout,
            bootstrap=config.direct_agents,
        )

    async def close(self) -> None:
        await self._services.close()
        if self._slow is not None:
            await self._slow.close()
        await self._agents.close()

    def _direct(self, mode: AttestationMode | None) -> bool:
        """Whether this node's agent is called directly (never for push)."""
        push = mode is not None and AttestationMode(mode) is AttestationMode.PUSH
        return self._config.direct_agents and not push

    @property
    def verifier_url(self) -> str:
        return self._config.verifier_url

    async def request(
        self, method: str, url: str, body: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """One JSON call to the registrar or the verifier; the JSON object
        answered (empty for no body).

        Raises:
            ServiceError: unreachable, a non-2xx answer (its message), or
                not an object.
        """
        return await self._call(method, url, body)

    async def agent_request(
        self, uuid: str, method: str, path: str, body: Mapping[str, Any] | None = None
    ) -> Mapping[str, Any]:
        """One call to a node's agent's own API (e.g. ``/v1/sealed``), with
        the tenant certificate, the agent's TLS certificate pinned from the
        registrar's record.

        Raises:
            ServiceError: unknown node, no tenant certificate, unreachable,
                or a non-2xx answer.
        """
        record = await self.identity(canonical_uuid(uuid))
        # the agent's own API, which the relay does not carry
        answer = await self._agents.call(uuid, record, method, path, body=body)
        if not isinstance(answer, dict):
            raise AgentError(f"node {uuid}: the agent's answer is not an object")
        return answer

    async def identity(self, uuid: str) -> RegistrationRecord:
        """The registrar's record of the node once its AK is activated.

        Raises:
            ServiceError: unreachable or refused, a malformed record or one
                of another node (code ``registrar_malformed``), or an AK
                not activated yet (code ``ak_not_activated``).
        """
        data = await self._call("GET", f"{self._config.registrar_url}/v1/agents/{uuid}")
        try:
            record = RegistrationRecord.from_dict(data)
            record.check_node(uuid)
        except MalformedError as exc:
            raise ServiceError(
                f"the registrar's record of node {uuid}: {exc}",
                code="registrar_malformed",
            )
        if not record.activated:
            raise ServiceError(
                f"node {uuid} has not activated its attestation key",
                code="ak_not_activated",
            )
        return record

    async def activated_record(self, uuid: str) -> RegistrationRecord | None:
        """The registrar's record once the node's AK is activated, else None
        (not registered yet, or not activated yet)."""
        try:
            return await self.identity(uuid)
        except ServiceError as exc:
            if exc.status == 404 or exc.code == "ak_not_activated":
                return None
            raise

    async def node_mode(self, uuid: str) -> AttestationMode:
        """``push`` if the verifier attests ``uuid`` by pushed evidence (its
        agent opens no port: the tenant goes through the relay), else
        ``pull`` (also for a node not enrolled yet)."""
        try:
            view = await self.status(uuid)
        except ServiceError as exc:
            if exc.status == 404:
                return AttestationMode.PULL
            raise
        if view.get("mode") == AttestationMode.PUSH:
            return AttestationMode.PUSH
        return AttestationMode.PULL

    async def check_identity_quote(
        self,
        uuid: str,
        record: RegistrationRecord,
        policy: PcrPolicy,
        mode: AttestationMode | None = None,
    ) -> bytes:
        """Verify a fresh identity quote over our own nonce; return the
        node's transport key.

        The verifier's relay asks the node (``mode`` ``push``: with its
        next challenge; ``pull``: the verifier asks the agent on its own
        connection); with ``direct_agents`` a polled agent is asked here
        (None: ask the verifier which mode the node is in). Either way
        the quote is checked here, by
        :func:`~verifier.protocol.relay.check_identity_answer`: the
        verifier is not trusted with it.

        Raises:
            AttestationFailedError: the quote does not verify.
            AgentError: the agent (or, relayed, the node) did not answer.
            ServiceError: the verifier refused the relay.
        """
        uuid = canonical_uuid(uuid)
        nonce = os.urandom(20)
        pcrs = policy.pcrs or (10,)  # a runtime-policy-only enrolment
        request = QuoteRequest(nonce, tuple(pcrs))
        if mode is None and self._config.direct_agents:
            mode = await self.node_mode(uuid)
        if not self._direct(mode):
            try:
                answer = await self._relay.identity(uuid, request)
            except ServiceError as exc:
                if exc.code != "revoked":
                    raise
                raise AttestationFailedError(  # its first quote failed
                    f"node {uuid} failed the verifier's attestation before its "
                    f"identity quote, nothing was sent: {exc}"
                )
        else:
            answer = await self._agents.bootstrap_call(
                uuid, record, "GET", "/v1/quote", params=request.to_query()
            )
        try:
            ak = AttestationKey(record.ak_public, True)
            return check_identity_answer(answer, ak, nonce, policy)
        except (EvidenceError, MalformedError, ValueError) as exc:
            raise AttestationFailedError(
                f"node {uuid} failed its identity quote, nothing was sent: {exc}"
            )

    async def enrol(
        self,
        uuid: str,
        payload: bytes,
        policy: PcrPolicy,
        *,
        runtime_policy: str | None = None,
        mb_policy: str | None = None,
        mode: AttestationMode = AttestationMode.PULL,
        interval: float | None = None,
    ) -> EnrolResult:
        """Enrol ``uuid``: verifier gets V and the policies, the node gets U.

        ``runtime_policy`` and ``mb_policy`` name policies stored at the
        verifier (:meth:`add_policy`); ``policy`` may then be empty.
        ``mode`` is ``pull`` (the verifier polls the agent) or ``push`` (the
        agent posts its evidence). ``interval`` is the node's own seconds
        between quotes, its verification class (None: the verifier's).
        """
        uuid, mode = canonical_uuid(uuid), AttestationMode(mode)
        if len(payload) > MAX_PAYLOAD_BYTES:
            raise ServiceError(
                f"payload is {len(payload)} bytes; at most "
                f"{MAX_PAYLOAD_BYTES} are allowed"
            )
        record = await self.identity(uuid)
        nk = None
        if self._direct(mode):  # before the verifier holds anything
            nk = await self.check_identity_quote(uuid, record, policy, mode)
        key = generate_key()
        sealed = seal_payload(key, payload, uuid)
        u_share, v_share = split(key)
        view = await self._post_enrolment(
            EnrolmentRequest(
                uuid,
                v_share,
                policy,
                runtime_policy,
                mb_policy,
                mode=mode,
                u_commitment=commit_u(uuid, u_share),
                interval=interval,
            )
        )
        try:
            if nk is None:
                # the relay needs the node enrolled; V alone is worthless,
                # and U goes only after our own identity check, and (polled)
                # after the verifier's first verdict: a node revoked at its
                # first quote fails here with the verifier's reason
                if mode is AttestationMode.PULL:
                    await self._relay.first_verdict(
                        uuid, str(view["state"]), self._config.timeout
                    )
                nk = await self.check_identity_quote(uuid, record, policy, mode)
            await self.send_u(uuid, record, nk, u_share, sealed, mode=mode)
        except (ServiceError, AttestationFailedError) as exc:
            await self._undo(uuid, exc)
        return EnrolResult(uuid, view["state"], policy.pcrs)

    async def _post_enrolment(self, body: EnrolmentRequest) -> dict[str, Any]:
        """Hand V and the policies to the verifier; its view of the node.

        Raises:
            ServiceError: refused or unreachable.
        """
        url = f"{self._config.verifier_url}/v1/nodes"
        return await self._call("POST", url, body.to_dict())

    async def enrol_ahead(
        self,
        uuid: str,
        v_share: bytes,
        policy: PcrPolicy,
        u_commitment: bytes,
        mode: AttestationMode = AttestationMode.PULL,
        runtime_policy: str | None = None,
        mb_policy: str | None = None,
    ) -> Mapping[str, Any]:
        """Enrol an instance Nova is still creating: the verifier holds V,
        the policy and the commitment to U (:func:`commit_u` of the U this
        tenant will send) and waits for the instance and its agent.
        ``runtime_policy`` and ``mb_policy`` name policies stored with the
        verifier (checked with every quote, as for :meth:`enrol`).

        Raises:
            ServiceError: refused (``code`` ``already_enrolled`` for a
                duplicate) or unreachable.
        """
        return await self._post_enrolment(
            EnrolmentRequest(
                uuid,
                v_share,
                policy,
                runtime_policy,
                mb_policy,
                await_instance=True,
                mode=mode,
                u_commitment=u_commitment,
            )
        )

    async def send_u(
        self,
        uuid: str,
        record: RegistrationRecord,
        nk: bytes,
        u_share: bytes,
        sealed: bytes | None,
        payload_id: str | None = None,
        mode: AttestationMode | None = None,
    ) -> bool:
        """Send U (sealed to the quoted NK) and the payload envelope.

        ``sealed`` None sends U alone: the node has the payload from the
        user-data of ``trusted-nova boot`` (and the boot id it is bound to).
        ``mode`` as :meth:`check_identity_quote`: U goes through the
        verifier's relay, which holds it opaque (or, with
        ``direct_agents``, to a polled agent directly).

        Returns:
            True if this completed the node's bootstrap (V was there).

        Raises:
            AgentError: the agent did not take it, or its answer is malformed.
        """
        body = ShareU(seal_share(nk, u_share, ShareKind.U, uuid), sealed, payload_id)
        if mode is None and self._config.direct_agents:
            mode = await self.node_mode(uuid)
        if not self._direct(mode):
            return await self._relay.send_u(uuid, body)
        answer = await self._agents.bootstrap_call(
            uuid, record, "POST", "/v1/keys/u", body=body.to_dict()
        )
        try:
            return ShareAccepted.from_dict(answer).bootstrapped
        except MalformedError as exc:
            raise AgentError(f"node {uuid}: {exc}")

    async def _undo(self, uuid: str, cause: TenantError) -> NoReturn:
        """Take V back from the verifier after the node failed its identity
        quote (``cause`` an :class:`AttestationFailedError`: nothing was
        sent to it) or did not take U.

        Raises:
            AttestationFailedError: ``cause``, V taken back.
            ServiceError: U did not reach the node, or V could not be taken
                back (the message says how to).
        """
        quote_failed = isinstance(cause, AttestationFailedError)
        try:
            await self.delete(uuid)
        except ServiceError as exc:
            if quote_failed:
                raise ServiceError(
                    f"{cause}; undoing the enrolment failed too ({exc}): run "
                    f"'trusted-tenant delete {uuid}'"
                )
            raise ServiceError(
                f"sending U to node {uuid} failed ({cause}) and undoing the "
                f"enrolment failed too ({exc}): the verifier still holds V for "
                f"it; run 'trusted-tenant delete {uuid}'"
            )
        if quote_failed:
            raise cause
        raise ServiceError(
            f"sending U to node {uuid} failed ({cause}); the enrolment was "
            f"undone, the verifier holds nothing for it"
        )

    async def status(self, uuid: str) -> Mapping[str, Any]:
        return await self._call(
            "GET", f"{self._config.verifier_url}/v1/nodes/{canonical_uuid(uuid)}"
        )

    async def nodes(self) -> list[Mapping[str, Any]]:
        data = await self._call("GET", f"{self._config.verifier_url}/v1/nodes")
        return list(data["nodes"])

    async def revoke(self, uuid: str, detail: str) -> Mapping[str, Any]:
        return await self._call(
            "POST",
            f"{self._config.verifier_url}/v1/nodes/{canonical_uuid(uuid)}/revoke",
            RevokeRequest(detail).to_dict(),
        )

    async def set_policy(
        self, uuid: str, changes: Mapping[str, str | None]
    ) -> Mapping[str, Any]:
        """Change the policies in force on a node: ``changes`` maps
        ``runtime_policy`` and/or ``mb_policy`` to a stored policy's
        reference (a bare name follows it; ``name@version`` or a digest
        pins) or None (no policy of that kind). Returns the node's view.

        Raises:
            MalformedError: no change, or a reference that is too long.
            TenantError: the verifier refused it (naming why).
        """
        body = PolicyChangeRequest(changes).to_dict()
        return await self._call(
            "PUT",
            f"{self._config.verifier_url}/v1/nodes/{canonical_uuid(uuid)}/policy",
            body,
        )

    async def delete(self, uuid: str) -> None:
        await self._call(
            "DELETE", f"{self._config.verifier_url}/v1/nodes/{canonical_uuid(uuid)}"
        )

    async def events(self, uuid: str | None = None) -> list[Mapping[str, Any]]:
        """Every event of node ``uuid`` (or of every node the caller
        sees), oldest first, following every page."""
        node = canonical_uuid(uuid) if uuid else None
        page = await self.list_events(EventQuery(node=node, limit=MAX_LIMIT), True)
        return list(reversed(page["events"]))

    async def list_events(
        self, query: EventQuery, all_pages: bool = False
    ) -> dict[str, Any]:
        """``GET /v1/events``: the page ``query`` asks for (newest first),
        or with ``all_pages`` every page after it too.

        Returns:
            ``{"events": [...], "links": [...]}`` (links: of the last page
            read; empty when there is no more).
        """
        params: dict[str, str] | None = query.to_query()
        events: list[Mapping[str, Any]] = []
        links: list[Any] = []
        while params is not None:
            url = f"{self._config.verifier_url}/v1/events?{urlencode(params)}"
            data = await self._call("GET", url)
            events += data["events"]
            links = list(data.get("links", []))
            params = next_params(links) if all_pages else None
        return {"events": events, "links": links}

    # -- the attestation log ------------------------------------------------

    async def history(
        self, uuid: str, since: str | None = None, until: str | None = None
    ) -> dict[str, Any]:
        """A node's attestation log entries with their proofs (``since``,
        ``until``: ISO 8601), as the verifier answers them (unverified)."""
        query = {k: v for k, v in (("since", since), ("until", until)) if v}
        path = f"/v1/nodes/{canonical_uuid(uuid)}/history"
        if query:
            path += "?" + urlencode(query)
        return await self._call("GET", f"{self._config.verifier_url}{path}")

    async def log_checkpoint(self) -> dict[str, Any]:
        """The log's latest signed checkpoint note and the verifier's
        event key (PEM) that signs it: ``{"checkpoint", "key"}``."""
        url = f"{self._config.verifier_url}/v1/log/checkpoint?format=json"
        return await self._call("GET", url)

    async def log_consistency(self, old: int, new: int) -> dict[str, Any]:
        """The consistency proof of the log from size ``old`` to ``new``."""
        query = urlencode({"from": old, "to": new})
        url = f"{self._config.verifier_url}/v1/log/consistency?{query}"
        return await self._call("GET", url)

    # -- stored policies (kind: "runtime" or "measured-boot") -----------------

    def _policies_url(self, kind: str, ref: str | None = None) -> str:
        url = f"{self._config.verifier_url}/v1/policies/{quote(kind, safe='')}"
        return url if ref is None else f"{url}/{quote(ref, safe='@')}"

    async def add_policy(
        self,
        kind: str,
        document: Mapping[str, Any],
        name: str | None = None,
        signature: bytes | None = None,
    ) -> Mapping[str, Any]:
        """Store a policy at the verifier; returns its metadata (name,
        version, digest)."""
        body = PolicyUpload(document, name, signature)
        return await self._call("POST", self._policies_url(kind), body.to_dict())

    async def policies(self, kind: str) -> list[Mapping[str, Any]]:
        data = await self._call("GET", self._policies_url(kind))
        return list(data["policies"])

    async def policy(self, kind: str, ref: str) -> Mapping[str, Any]:
        return await self._call("GET", self._policies_url(kind, ref))

    async def delete_policy(self, kind: str, ref: str) -> None:
        await self._call("DELETE", self._policies_url(kind, ref))

    async def check_policy(
        self, ref: str, nodes: tuple[str, ...] = (), everything: bool = False
    ) -> PolicyCheckReport:
        """The dry run of runtime policy ``ref``: what it would refuse of
        each of ``nodes`` (or of every node of the project) whole current
        IMA list, fetched live by the verifier; nothing changes.

        Raises:
            MalformedError: a node that is not a UUID, both or neither of
                ``nodes`` and ``everything``, too many nodes; an answer
                that does not parse.
            ServiceError: refused (404 ``unknown_policy`` or
                ``unknown_node``, 400) or unreachable.
        """
        url = f"{self._policies_url('runtime', ref)}/check"
        return await self._check(url, {}, nodes, everything)

    async def check_candidate(
        self,
        document: Mapping[str, Any],
        nodes: tuple[str, ...] = (),
        everything: bool = False,
    ) -> PolicyCheckReport:
        """The dry run of the runtime policy ``document``, which is not
        stored (nor signed: nothing is stored); a delta names its stored
        base in ``"base"``. As :meth:`check_policy` otherwise.

        Raises:
            MalformedError: as :meth:`check_policy`.
            ServiceError: refused (400 ``bad_policy``, 404
                ``unknown_policy`` naming a delta's missing base,
                ``unknown_node``, 413 ``policy_too_large``) or unreachable.
        """
        url = f"{self._policies_url('runtime')}/check"
        return await self._check(url, {"policy": document}, nodes, everything)

    async def _check(
        self,
        url: str,
        extra: Mapping[str, Any],
        nodes: tuple[str, ...],
        everything: bool,
    ) -> PolicyCheckReport:
        body = PolicyCheckRequest(
            tuple(dict.fromkeys(canonical_uuid(n) for n in nodes)), everything
        )
        if self._slow is None:
            timeout = max(self._config.timeout, CHECK_TIMEOUT)
            self._slow = ServiceClient(self._context, timeout, self._sessions)
        answer = await self._slow.call("POST", url, {**extra, **body.to_dict()})
        return PolicyCheckReport.from_dict(answer)
