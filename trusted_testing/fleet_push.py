"""Push mode of the fleet emulator: every emulated agent opens a session
with its software TPM's AK and posts evidence to the verifier's push
endpoint (:mod:`verifier.protocol.messages.push`), as ``node_agent.push``
does, as fast as the verifier's interval allows.

Run with ``python -m trusted_testing.fleet ... --push URL``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import aiohttp

from verifier.protocol import ShareKind, bind_nonce, open_share
from verifier.protocol.messages.push import (
    ChallengeMessage,
    EvidencePost,
    EvidenceResult,
    SessionGrant,
    SessionNonce,
    SessionProof,
)
from verifier.protocol.messages.quote import QuoteAnswer
from verifier.protocol.push import SESSION_LABEL


class EmulatedAgent(Protocol):
    """What pushing needs of an emulated agent
    (:class:`trusted_testing.fleet.EmulatedAgent` is one)."""

    uuid: str
    tpm: Any  # a SoftTpm: quote(nonce, pcrs)
    nk: Any
    nk_public: bytes
    quotes: int
    v_received: bool


LOG = logging.getLogger(__name__)


class _RefusedError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status


async def _post(
    session: aiohttp.ClientSession, url: str, body: Any = None, token: str = ""
) -> dict[str, Any]:
    headers = {"Authorization": f"TPM-Session {token}"} if token else {}
    async with session.post(url, json=body, headers=headers) as resp:
        data = await resp.json(content_type=None)
        if resp.status >= 300:
            raise _RefusedError(resp.status, data)
        return dict(data)


#: Seconds an agent's own connection is kept idle: as long as the real
#: agent's client keeps it (``verifier.common.http.AsyncClient``'s
#: ``idle_timeout``), below the verifier's ``[push] keepalive`` (75 s), so
#: that the agent, not the server, closes it.
_OWN_KEEPALIVE = 30.0

#: Seconds an agent not (yet) enrolled in push mode waits before it asks
#: again, doubling up to the last (a fleet registers long before it is
#: all enrolled: thousands of agents must not ask twice a second).
_NOT_ENROLLED_WAIT = (0.5, 30.0)


async def _push_one(
    csr_of: Callable[[], bytes],
    agent: EmulatedAgent,
    session: aiohttp.ClientSession,
    base: str,
    stop: asyncio.Event,
) -> None:
    url = f"{base}/v1/push/{agent.uuid}"
    token = ""
    interval = 0.0
    upcoming: ChallengeMessage | None = None
    waiting = _NOT_ENROLLED_WAIT[0]
    while not stop.is_set():
        try:
            if not token:
                nonce = SessionNonce.from_dict(await _post(session, url + "/session"))
                proof = agent.tpm.quote(
                    bind_nonce(nonce.nonce, SESSION_LABEL), nonce.pcrs
                )
                grant = SessionGrant.from_dict(
                    await _post(
                        session,
                        url + "/session/proof",
                        SessionProof(proof, nonce.expires_at).to_dict(),
                    )
                )
                token, interval = grant.token, grant.interval
            challenge, upcoming = upcoming, None
            if challenge is None:
                data = await _post(session, url + "/challenge", token=token)
                challenge = ChallengeMessage.from_dict(data)
            while challenge is not None:
                asked = challenge.request
                csr = csr_of() if asked.csr else None
                bound = (
                    (agent.nk_public, csr) if csr is not None else (agent.nk_public,)
                )
                quote = agent.tpm.quote(bind_nonce(asked.nonce, *bound), asked.pcrs)
                agent.quotes += 1
                post = EvidencePost(
                    challenge.id, QuoteAnswer(quote, agent.nk_public, csr)
                )
                result = EvidenceResult.from_dict(
                    await _post(session, url + "/evidence", post.to_dict(), token)
                )
                if result.v is not None:
                    open_share(agent.nk, result.v.v, ShareKind.V, agent.uuid)
                    agent.v_received = True
                challenge = result.next
            upcoming = result.upcoming
            if result.state == "revoked":
                return
            interval = result.interval
            waiting = _NOT_ENROLLED_WAIT[0]
        except _RefusedError as exc:
            if exc.status == 401:
                token = ""
            elif exc.status in (404, 409):  # not enrolled (yet), revoked, pull
                await asyncio.sleep(waiting * random.uniform(0.5, 1.0))
                waiting = min(_NOT_ENROLLED_WAIT[1], waiting * 2)
            else:
                LOG.debug("push of %s refused: %s", agent.uuid, exc)
                await asyncio.sleep(0.05)
            continue
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            LOG.debug("push of %s failed: %s", agent.uuid, exc)
            await asyncio.sleep(0.5)
            continue
        if interval > 0:
            await asyncio.sleep(interval)
        else:
            await asyncio.sleep(0)  # let the others run


async def push_all(
    agents: Sequence[EmulatedAgent],
    csr: Callable[[], bytes],
    base: str,
    ca_file: str,
    stop: asyncio.Event,
    limit: int = 256,
    own_connections: bool = False,
) -> None:
    """Push the evidence of ``agents`` (with the fleet's ``csr`` when
    asked for one) to ``base`` until ``stop`` is set: through one pool of
    at most ``limit`` connections, or with ``own_connections`` each agent
    over a connection of its own, as real agents do (kept idle between
    rounds for up to 30 s, as the real agent's client keeps it, unless the
    server closes it first), which is what the verifier's memory per push
    node includes."""
    ctx = ssl.create_default_context(cafile=ca_file)
    if own_connections:

        async def alone(agent: EmulatedAgent) -> None:
            connector = aiohttp.TCPConnector(
                ssl=ctx, limit=1, keepalive_timeout=_OWN_KEEPALIVE
            )
            async with aiohttp.ClientSession(connector=connector) as session:
                await _push_one(csr, agent, session, base, stop)

        tasks = [asyncio.create_task(alone(a)) for a in agents]
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return
    connector = aiohttp.TCPConnector(ssl=ctx, limit=limit)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = [
            asyncio.create_task(_push_one(csr, a, session, base, stop)) for a in agents
        ]
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
