"""Push mode of the node agent (``[agent] attestation_mode = push``): the
agent calls out to the verifier's push endpoint instead of waiting to be
polled, so the verifier needs no route to the node (no floating IP, no
open security group). See :mod:`verifier.protocol.push` for the exchange.

The loop: open a session by quoting the verifier's nonce with the AK
(the TPM is the agent's only credential), then, every interval the
verifier names, ask for a challenge, quote and read the IMA and firmware
logs it asks for (as for a polled quote), and post the evidence. The
answer to the first good evidence carries V and the identity
certificate; incomplete evidence is answered with a follow-up challenge,
answered at once. A refused or failed exchange is logged and retried
with a backoff; a revoked node stops pushing.

The tenant reaches a push node through the verifier too
(:mod:`verifier.protocol.relay`): a challenge may carry the tenant's
nonce, answered with an identity quote beside the evidence, and an answer
may carry the tenant's U (sealed to NK), whose outcome goes with the next
evidence. The agent needs no inbound port at all.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from collections.abc import Callable
from typing import Any

from node_agent.agent import Agent
from node_agent.evidence import EvidenceReader
from node_agent.exceptions import BootstrapError, NodeAgentError
from verifier.common.errors import TransportError
from verifier.common.http import MAX_ANSWER, AsyncClient
from verifier.common.tls import client_context
from verifier.protocol import EnvelopeError, MalformedError, Quote, bind_nonce
from verifier.protocol.messages.abe import AbeKeyDelivery
from verifier.protocol.messages.push import (
    ChallengeMessage,
    EvidencePost,
    EvidenceResult,
    SessionGrant,
    SessionNonce,
    SessionProof,
    UOutcome,
)
from verifier.protocol.messages.shares import MAX_PAYLOAD_ENVELOPE, ShareU
from verifier.protocol.push import SESSION_LABEL

__all__ = ["PushExchangeError", "PushLoop", "push_ssl_context"]

LOG = logging.getLogger(__name__)
_TIMEOUT = 30.0
_MAX_BACKOFF = 60.0
#: Retry delay while the node is not (yet) enrolled in push mode: the
#: tenant enrols it shortly after boot, and its deadline then runs.
_NOT_ENROLLED_RETRY = 2.0
_MAX_FOLLOW_UPS = 64
#: An answer may carry a relayed U with its sealed payload (base64).
_MAX_ANSWER = MAX_ANSWER + 4 * (MAX_PAYLOAD_ENVELOPE // 3 + 1)


class PushExchangeError(NodeAgentError):
    """An exchange with the push endpoint failed.

    Attributes:
        code: the endpoint's error code (``transport`` when unreachable).
        status: the HTTP status (0 when unreachable).
    """

    def __init__(self, code: str, detail: str, status: int = 0) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.status = status


def push_ssl_context(ca_file: str | None) -> ssl.SSLContext:
    """TLS towards the push endpoint: the operator CA, no client certificate.

    Raises:
        BootstrapError: no CA, or it cannot be loaded.
    """
    if not ca_file:
        raise BootstrapError(
            "[agent] ca_file (or the bootstrap file's ca_pem) is required to push"
        )
    try:
        return client_context(None, None, ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise BootstrapError(f"cannot load ca_file {ca_file}: {exc}")


class PushLoop:
    """Pushes the agent's evidence to the verifier.

    Args:
        agent: the agent (its TPM, NK, CSR; it receives V).
        evidence: reads the IMA and firmware logs.
        url: the push endpoint, e.g. ``https://verifier:8882``.
        http: the client (TLS trusting the operator CA).
        sleep: waits (tests replace it).
        on_abe: takes a CP-ABE key delivery (None: the ``abe`` extra is
            not installed; keys are then ignored).
    """

    def __init__(
        self,
        agent: Agent,
        evidence: EvidenceReader,
        url: str,
        http: AsyncClient,
        sleep: Callable[[float], Any] = asyncio.sleep,
        on_abe: Callable[[AbeKeyDelivery], None] | None = None,
    ) -> None:
        self.agent = agent
        self._on_abe = on_abe
        self.evidence = evidence
        self.base = f"{url.rstrip('/')}/v1/push/{agent.uuid}"
        self.http = http
        self._sleep = sleep
        self._token: str | None = None
        self._upcoming: ChallengeMessage | None = None
        self.interval = 2.0
        self._u_outcome: UOutcome | None = None  # to report with evidence
        self._u_digest: bytes | None = None
        self._u_last: UOutcome | None = None
        #: the node's state as the verifier last said
        self.state: str | None = None
        self.rounds = 0

    async def _post(
        self, path: str, body: Any = None, token: bool = False
    ) -> dict[str, Any]:
        headers = {"Authorization": f"TPM-Session {self._token}"} if token else None
        try:
            answer = await self.http.request(
                "POST", self.base + path, json=body, headers=headers
            )
        except TransportError as exc:
            raise PushExchangeError("transport", str(exc)) from exc
        if not answer.ok:
            error = answer.error
            if answer.status == 401:
                self._token = None  # open a new session next time
            raise PushExchangeError(error.code or "http", error.message, answer.status)
        if not isinstance(answer.data, dict):
            raise PushExchangeError("malformed", f"{path}: the answer is not an object")
        return answer.data

    async def _quote(self, qualifying: bytes, pcrs: tuple[int, ...]) -> Quote:
        raw = await self.agent.tpm.run(lambda tpm: tpm.quote(qualifying, list(pcrs)))
        return Quote(raw.attest, raw.signature, dict(raw.pcr_values))

    async def open_session(self) -> None:
        """Prove the AK over the verifier's nonce; keep the session token."""
        nonce = SessionNonce.from_dict(await self._post("/session"))
        quote = await self._quote(bind_nonce(nonce.nonce, SESSION_LABEL), nonce.pcrs)
        grant = SessionGrant.from_dict(
            await self._post(
                "/session/proof", SessionProof(quote, nonce.expires_at).to_dict()
            )
        )
        self._token, self.interval = grant.token, grant.interval
        LOG.info("node %s opened a push session", self.agent.uuid)

    async def _answer(self, challenge: ChallengeMessage) -> EvidenceResult:
        asked = challenge.request
        answer = await self.agent.quote(
            asked.nonce, list(asked.pcrs), asked.csr, asked.banks
        )
        if asked.ima_from is not None or asked.mb:
            answer = await asyncio.to_thread(
                self.evidence.add_to, answer, asked.ima_from, asked.mb
            )
        identity = None
        if challenge.identity is not None:  # a tenant's nonce, relayed
            ident = challenge.identity
            identity = await self.agent.quote(ident.nonce, list(ident.pcrs), False)
        post = EvidencePost(
            challenge.id, answer, identity, self._u_outcome, self.agent.holds_v
        )
        result = EvidenceResult.from_dict(
            await self._post("/evidence", post.to_dict(), token=True)
        )
        self._u_outcome = None  # reported
        return result

    async def _receive_u(self, share: ShareU) -> None:
        """Take U the tenant relayed through the verifier (sealed to NK,
        opaque to the verifier); its outcome goes with the next evidence.
        The same U again (an answer was lost) gets the same outcome."""
        digest = hashlib.sha256(share.u).digest()
        if digest == self._u_digest and self._u_last is not None:
            self._u_outcome = self._u_last
            return
        try:
            done = await self.agent.receive_u(share.u, share.payload, share.payload_id)
            outcome = UOutcome(True, done)
            LOG.info("node %s: U relayed by the verifier accepted", self.agent.uuid)
        except (EnvelopeError, MalformedError, NodeAgentError) as exc:
            LOG.error("node %s: relayed U refused: %s", self.agent.uuid, exc)
            outcome = UOutcome(False, False, str(exc)[:500])
        self._u_digest, self._u_last, self._u_outcome = digest, outcome, outcome

    async def round(self) -> EvidenceResult:
        """One challenge and its evidence (with follow-ups at once).

        Raises:
            PushExchangeError: refused or unreachable.
            MalformedError: an answer that does not parse.
            TpmError: the TPM failed.
        """
        if self._token is None:
            await self.open_session()
        challenge, self._upcoming = self._upcoming, None
        if challenge is None:  # else the one given with the last answer
            challenge = ChallengeMessage.from_dict(
                await self._post("/challenge", token=True)
            )
        for _ in range(_MAX_FOLLOW_UPS):
            result = await self._answer(challenge)
            self.rounds += 1
            self.state, self.interval = result.state, result.interval
            if result.v is not None:
                await self._receive_v(result)
            if result.u is not None:
                await self._receive_u(result.u)
            if result.abe is not None and self._on_abe is not None:
                self._receive_abe(result.abe)
            if result.next is None:
                self._upcoming = result.upcoming
                return result
            challenge = result.next
        raise PushExchangeError(
            "too_many_follow_ups", "the verifier kept asking for more"
        )

    async def _receive_v(self, result: EvidenceResult) -> None:
        assert result.v is not None
        cert = result.v.identity_cert
        try:
            await self.agent.receive_v(
                result.v.v,
                cert.encode() if cert is not None else None,
                result.v.u_commitment,
            )
        except (EnvelopeError, NodeAgentError) as exc:
            LOG.error("node %s: V from the verifier refused: %s", self.agent.uuid, exc)

    def _receive_abe(self, delivery: AbeKeyDelivery) -> None:
        assert self._on_abe is not None
        try:
            self._on_abe(delivery)
        except (EnvelopeError, MalformedError, NodeAgentError) as exc:
            LOG.error("node %s: CP-ABE key refused: %s", self.agent.uuid, exc)

    async def run(self) -> None:
        """Push until the node is revoked (or the task is cancelled)."""
        failures = 0
        while True:
            try:
                result = await self.round()
            except (PushExchangeError, MalformedError, NodeAgentError) as exc:
                failures += 1
                delay = min(_MAX_BACKOFF, self.interval * 2 ** min(failures, 6))
                code = getattr(exc, "code", "malformed")
                if code in ("unknown_node", "not_push_mode"):
                    delay = _NOT_ENROLLED_RETRY
                if code == "revoked":
                    LOG.error("node %s is revoked: no more evidence", self.agent.uuid)
                    return
                LOG.warning(
                    "node %s: push failed (%s); again in %.1f s",
                    self.agent.uuid,
                    exc,
                    delay,
                )
                await self._sleep(delay)
                continue
            failures = 0
            if result.state == "revoked":
                LOG.error("node %s was revoked by the verifier", self.agent.uuid)
                return
            await self._sleep(result.interval)


async def run_push(
    agent: Agent,
    evidence: EvidenceReader,
    url: str,
    on_abe: Callable[[AbeKeyDelivery], None] | None = None,
) -> None:
    """Run :class:`PushLoop` with its own client until cancelled or revoked."""
    ctx = push_ssl_context(agent.ca_file)
    async with AsyncClient(ctx, _TIMEOUT, max_answer=_MAX_ANSWER) as http:
        await PushLoop(agent, evidence, url, http, on_abe=on_abe).run()
