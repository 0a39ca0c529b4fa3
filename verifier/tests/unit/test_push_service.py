"""Push attestation through the verifier's push endpoint
(verifier.api.push_app over verifier.attest.push), hermetically: the
service of test_attest_service with its SoftTpm agents, served by aiohttp
on loopback. Each attack of issue 20 is refused with its JSON 4xx and
leaves the node as the threat demands."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
from typing import Any

from trusted_testing.lean_serve import LeanTestClient, LeanTestServer
from trusted_testing.softtpm import SoftTpm
from verifier.api.push_app import make_push_app
from verifier.attest.service import Verifier
from verifier.attest.settings import VerifierSettings
from verifier.common import metrics
from verifier.notify import Outbox
from verifier.protocol import MalformedError, PcrPolicy, bind_nonce
from verifier.protocol.events import NODE_UNREACHABLE
from verifier.protocol.messages.enrolment import EnrolmentRequest
from verifier.protocol.messages.hosts import HostEnrolmentRequest
from verifier.protocol.push import SESSION_LABEL, PushRules
from verifier.tests.unit.test_attest_service import (
    FakeAgent,
    VerifierServiceBase,
    _b64,
)

RULES = PushRules(challenge_ttl=10.0, min_gap=1.0, max_evidence_bytes=64 * 1024)
T0 = 1_700_000_000.0


class PushServiceTest(VerifierServiceBase):
    async def asyncSetUp(self) -> None:
        self.now = T0
        outbox = Outbox(self.engine, [self.notifier])
        self.verifier = Verifier(
            self.engine,
            self.signing_key,
            self.registrar,  # type: ignore[arg-type]
            self.agents,  # type: ignore[arg-type]
            outbox,
            self.ca,
            VerifierSettings(interval=2.0, max_unreachable=3, push_rules=RULES),
            clock=lambda: self.now,
        )
        self.verifiers.append(self.verifier)
        self.client = LeanTestClient(LeanTestServer(make_push_app(self.verifier.push)))
        await self.client.start_server()
        self.addAsyncCleanup(self.client.close)

    async def _enrol(
        self, mode: str = "push", interval: float | None = None
    ) -> tuple[FakeAgent, bytes]:
        agent = self.new_agent()
        v_share = os.urandom(32)
        view = await self.verifier.commands.enrol(
            agent.uuid, v_share, self.policy, mode=mode, interval=interval
        )
        self.quiesce(self.verifier)
        self.assertEqual(mode, view.mode)
        return agent, v_share

    async def _post(
        self,
        path: str,
        body: Any = None,
        token: str | None = None,
        data: bytes | None = None,
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"TPM-Session {token}"} if token else {}
        response = await self.client.post(
            path, json=body if data is None else None, data=data, headers=headers
        )
        return response.status, await response.json()

    async def _session(self, agent: FakeAgent, tpm: SoftTpm | None = None) -> Any:
        status, nonce = await self._post(f"/v1/push/{agent.uuid}/session")
        self.assertEqual(201, status, nonce)
        proof = (tpm or agent.tpm).quote(
            bind_nonce(bytes.fromhex(nonce["nonce"]), SESSION_LABEL),
            tuple(nonce["pcrs"]),
        )
        body = {"quote": proof.to_dict(), "expires_at": nonce["expires_at"]}
        return await self._post(f"/v1/push/{agent.uuid}/session/proof", body)

    async def _token(self, agent: FakeAgent) -> str:
        status, grant = await self._session(agent)
        self.assertEqual(201, status, grant)
        return str(grant["token"])

    async def _challenge(self, agent: FakeAgent, token: str) -> dict[str, Any]:
        status, challenge = await self._post(
            f"/v1/push/{agent.uuid}/challenge", token=token
        )
        self.assertEqual(201, status, challenge)
        return dict(challenge)

    async def _evidence(
        self, agent: FakeAgent, token: str, challenge: dict[str, Any]
    ) -> dict[str, Any]:
        answer = await agent.quote(challenge["request"])
        return {"challenge": challenge["id"], "evidence": answer}

    async def _attest(self, agent: FakeAgent) -> tuple[str, dict[str, Any]]:
        token = await self._token(agent)
        challenge = await self._challenge(agent, token)
        post = await self._evidence(agent, token, challenge)
        status, result = await self._post(
            f"/v1/push/{agent.uuid}/evidence", post, token
        )
        self.assertEqual(200, status, result)
        return token, result

    async def _state(self, agent: FakeAgent) -> str:
        return (await self.verifier.queries.get(agent.uuid)).state

    # -- the good path -----------------------------------------------------------

    async def test_good_pushed_evidence_joins_its_hosts_batch(self) -> None:
        # the push node's compute host is enrolled: its good quote is batched
        agent, _ = await self._enrol()
        host = self.new_agent()
        request = HostEnrolmentRequest(host.uuid, "compute-1", self.policy)
        await self.verifier.hosts.enrol(request, "ops")
        self.quiesce(self.verifier)
        self.verifier.host_batches.placed(agent.uuid, "compute-1")
        await self._attest(agent)
        await self.verifier.rounds.attest_once(host.uuid)
        self.assertEqual(1, self.verifier.host_batches.rounds[host.uuid].size)
        self.assertIn(agent.uuid, self.verifier.host_batches.proofs)

    async def test_first_good_evidence_gets_v_and_identity_in_the_answer(
        self,
    ) -> None:
        agent, v_share = await self._enrol()
        token, result = await self._attest(agent)
        self.assertEqual("attested", result["state"])
        self.assertEqual(2.0, result["interval"])
        envelope = base64.b64decode(result["v"]["v"])
        self.assertEqual(v_share, agent.open_v({"v": _b64(envelope)}))
        self.assert_identity_cert(agent, result["v"]["identity_cert"])
        self.assertEqual([], agent.v_posts)  # nothing was sent to the agent
        self.now += 2.0
        challenge = await self._challenge(agent, token)
        self.assertEqual("0", challenge["request"]["csr"])
        post = await self._evidence(agent, token, challenge)
        status, again = await self._post(f"/v1/push/{agent.uuid}/evidence", post, token)
        self.assertEqual((200, "attested", None), (status, again["state"], again["v"]))
        self.assertEqual(
            2, (await self.verifier.queries.get(agent.uuid)).quotes_verified
        )

    async def test_push_sessions_and_pushed_quotes_are_counted(self) -> None:
        def value(name: str, **labels: str) -> float:
            return metrics.REGISTRY.get_sample_value(name, labels) or 0.0

        sessions = "trusted_cloud_push_sessions_total"
        passed = {"mode": "push", "result": "pass", "reason": "none"}
        before = (
            value(sessions, step="opened"),
            value(sessions, step="granted"),
            value("trusted_cloud_attestations_total", **passed),
            value("trusted_cloud_quote_round_seconds_count", mode="push"),
        )
        agent, _ = await self._enrol()
        await self._attest(agent)
        after = (
            value(sessions, step="opened"),
            value(sessions, step="granted"),
            value("trusted_cloud_attestations_total", **passed),
            value("trusted_cloud_quote_round_seconds_count", mode="push"),
        )
        self.assertEqual(tuple(b + 1 for b in before), after)

    async def test_push_node_is_never_polled(self) -> None:
        agent, _ = await self._enrol()
        await self.verifier.rounds.attest_once(agent.uuid)
        self.assertEqual([], agent.quote_requests)

    async def test_bad_evidence_revokes_with_a_signed_event(self) -> None:
        agent, _ = await self._enrol()
        agent.tpm.extend(16, b"\x01" * 32)  # something unexpected ran
        _, result = await self._attest(agent)
        self.assertEqual("revoked", result["state"])
        rows = self.outbox_rows()
        self.assertEqual(1, len(rows))
        self.assert_signed_event(rows[0], agent.uuid, "pcr_policy")

    # -- deadlines -----------------------------------------------------------------

    async def test_silent_push_node_is_unreachable_by_its_deadline_with_an_event(
        self,
    ) -> None:
        agent, _ = await self._attest_once_enrolled()
        for _ in range(4):  # the grace, then max_unreachable missed rounds
            self.now += 20.0
            await self.verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("unreachable", await self._state(agent))
        rows = self.outbox_rows()
        self.assertEqual(1, len(rows))
        self.assert_signed_event(rows[0], agent.uuid, "unreachable")
        self.assertIn(NODE_UNREACHABLE, rows[0].body)

    async def _attest_once_enrolled(self) -> tuple[FakeAgent, str]:
        agent, _ = await self._enrol()
        token, result = await self._attest(agent)
        self.assertEqual("attested", result["state"])
        return agent, token

    async def test_node_posting_in_time_stays_attested(self) -> None:
        agent, token = await self._attest_once_enrolled()
        for _ in range(5):
            self.now += 2.0
            challenge = await self._challenge(agent, token)
            post = await self._evidence(agent, token, challenge)
            await self._post(f"/v1/push/{agent.uuid}/evidence", post, token)
            await self.verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", await self._state(agent))
        self.assertEqual([], self.outbox_rows())

    async def test_push_node_with_its_own_interval_is_told_it_and_held_to_it(
        self,
    ) -> None:
        agent, _ = await self._enrol(interval=60.0)
        node = self.verifier.nodes.live(agent.uuid)
        self.assertEqual(60.0, self.verifier.settings.interval_of(node))
        status, grant = await self._session(agent)
        self.assertEqual(201, status, grant)
        self.assertEqual(60.0, grant["interval"])
        token = str(grant["token"])
        challenge = await self._challenge(agent, token)
        post = await self._evidence(agent, token, challenge)
        status, result = await self._post(
            f"/v1/push/{agent.uuid}/evidence", post, token
        )
        self.assertEqual(200, status, result)
        self.assertEqual(("attested", 60.0), (result["state"], result["interval"]))
        # a minute apart is longer than a challenge lives: none rides along
        self.assertIsNone(result.get("upcoming"))
        # silent for its interval plus a challenge's life: still in time,
        # although the verifier's own interval (2 s) passed thirty times
        self.now += 60.0 + RULES.challenge_ttl - 1
        await self.verifier.rounds.attest_once(agent.uuid)
        challenge = await self._challenge(agent, token)
        post = await self._evidence(agent, token, challenge)
        status, result = await self._post(
            f"/v1/push/{agent.uuid}/evidence", post, token
        )
        self.assertEqual(200, status, result)
        self.assertEqual("attested", await self._state(agent))
        self.assertEqual([], self.outbox_rows())
        # then silent: one missed round per 60 s after the grace
        self.now += 60.0 + RULES.challenge_ttl + 1
        await self.verifier.rounds.attest_once(agent.uuid)
        for _ in range(2):
            self.now += 30.0  # visits within one interval count nothing more
            await self.verifier.rounds.attest_once(agent.uuid)
        self.assertEqual(1, self.verifier.nodes.live(agent.uuid).unreachable)
        for _ in range(2):  # max_unreachable (3) missed rounds in all
            self.now += 61.0
            await self.verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("unreachable", await self._state(agent))

    async def test_a_round_ends_with_a_close_when_the_node_comes_back_after_keepalive(
        self,
    ) -> None:
        # the server's keepalive is 30 s: a node told to come back in 60 s
        # has its connection closed with its round's last answer; a node
        # coming back in 2 s (the verifier's interval) keeps it
        client = LeanTestClient(
            LeanTestServer(make_push_app(self.verifier.push, keepalive=30.0))
        )
        await client.start_server()
        self.addAsyncCleanup(client.close)
        self.client = client
        for interval, closed in ((60.0, True), (None, False)):
            agent, _ = await self._enrol(interval=interval)
            token = await self._token(agent)
            challenge = await self._challenge(agent, token)
            post = await self._evidence(agent, token, challenge)
            headers = {"Authorization": f"TPM-Session {token}"}
            response = await client.post(
                f"/v1/push/{agent.uuid}/evidence", json=post, headers=headers
            )
            self.assertEqual(200, response.status, await response.text())
            self.assertEqual(
                closed, response.headers.get("Connection") == "close", interval
            )

    # -- bad input: one named test each ------------------------------------------

    async def test_evidence_for_another_node_is_refused(self) -> None:
        agent, token = await self._attest_once_enrolled()
        other, other_token = await self._attest_once_enrolled()
        self.now += 2.0
        challenge = await self._challenge(other, other_token)
        post = await self._evidence(agent, token, challenge)
        # its own session, the other node's challenge
        status, body = await self._post(f"/v1/push/{agent.uuid}/evidence", post, token)
        self.assertEqual((403, "wrong_node"), (status, body["error"]["code"]))
        # the other node's path with its own session
        status, body = await self._post(f"/v1/push/{other.uuid}/evidence", post, token)
        self.assertEqual((403, "wrong_node"), (status, body["error"]["code"]))
        self.assertEqual("attested", await self._state(agent))
        self.assertEqual("attested", await self._state(other))

    async def test_replayed_challenge_is_refused(self) -> None:
        agent, token = await self._attest_once_enrolled()
        self.now += 2.0
        old = await self._challenge(agent, token)
        self.now += 2.0
        await self._challenge(agent, token)  # replaces it
        post = await self._evidence(agent, token, old)
        status, body = await self._post(f"/v1/push/{agent.uuid}/evidence", post, token)
        self.assertEqual((409, "challenge_used"), (status, body["error"]["code"]))
        self.assertEqual("attested", await self._state(agent))

    async def test_expired_challenge_is_refused(self) -> None:
        agent, token = await self._attest_once_enrolled()
        self.now += 2.0
        challenge = await self._challenge(agent, token)
        self.now += RULES.challenge_ttl + 1
        post = await self._evidence(agent, token, challenge)
        status, body = await self._post(f"/v1/push/{agent.uuid}/evidence", post, token)
        self.assertEqual((410, "challenge_expired"), (status, body["error"]["code"]))
        self.assertEqual("attested", await self._state(agent))

    async def test_challenge_answered_twice_is_refused(self) -> None:
        agent, token = await self._attest_once_enrolled()
        self.now += 2.0
        challenge = await self._challenge(agent, token)
        post = await self._evidence(agent, token, challenge)
        status, _ = await self._post(f"/v1/push/{agent.uuid}/evidence", post, token)
        self.assertEqual(200, status)
        self.now += 2.0
        status, body = await self._post(f"/v1/push/{agent.uuid}/evidence", post, token)
        self.assertEqual((409, "challenge_used"), (status, body["error"]["code"]))
        self.assertEqual(
            2, (await self.verifier.queries.get(agent.uuid)).quotes_verified
        )

    async def test_evidence_too_frequent_is_refused(self) -> None:
        agent, token = await self._attest_once_enrolled()
        status, body = await self._post(f"/v1/push/{agent.uuid}/challenge", None, token)
        self.assertEqual((429, "too_frequent"), (status, body["error"]["code"]))
        self.assertEqual(
            1, (await self.verifier.queries.get(agent.uuid)).quotes_verified
        )

    async def test_evidence_too_large_is_refused(self) -> None:
        agent, token = await self._attest_once_enrolled()
        self.now += 2.0
        challenge = await self._challenge(agent, token)
        post = await self._evidence(agent, token, challenge)
        post["evidence"]["padding"] = "x" * RULES.max_evidence_bytes
        status, body = await self._post(f"/v1/push/{agent.uuid}/evidence", post, token)
        self.assertEqual(413, status)
        self.assertEqual("evidence_too_large", body["error"]["code"])
        self.assertEqual("attested", await self._state(agent))

    async def test_session_for_an_ak_never_activated_is_refused(self) -> None:
        agent, _ = await self._enrol()
        # a TPM whose AK the registrar never activated for this node
        status, body = await self._session(agent, SoftTpm(ak_alg="ecc", ek_alg="ecc"))
        self.assertEqual((401, "bad_session_proof"), (status, body["error"]["code"]))
        status, body = await self._post(
            f"/v1/push/{agent.uuid}/challenge", None, "guessed-token"
        )
        self.assertEqual((401, "no_session"), (status, body["error"]["code"]))
        self.assertEqual("registered", await self._state(agent))

    async def test_no_session_token_is_refused(self) -> None:
        agent, _ = await self._enrol()
        status, body = await self._post(f"/v1/push/{agent.uuid}/challenge")
        self.assertEqual((401, "no_session"), (status, body["error"]["code"]))

    async def test_pull_node_cannot_push(self) -> None:
        agent, _ = await self._enrol(mode="pull")
        status, body = await self._post(f"/v1/push/{agent.uuid}/session")
        self.assertEqual((409, "not_push_mode"), (status, body["error"]["code"]))

    async def test_unknown_node_is_404(self) -> None:
        status, body = await self._post(
            "/v1/push/6f1d7a2e-0f4b-4c1e-9a57-1d2e3f405161/session"
        )
        self.assertEqual((404, "unknown_node"), (status, body["error"]["code"]))

    async def test_malformed_evidence_post_is_400(self) -> None:
        agent, token = await self._attest_once_enrolled()
        status, body = await self._post(
            f"/v1/push/{agent.uuid}/evidence", data=b"{not json", token=token
        )
        self.assertEqual(400, status)
        status, body = await self._post(
            f"/v1/push/{agent.uuid}/evidence", {"challenge": 3}, token
        )
        self.assertEqual((400, "bad_field"), (status, body["error"]["code"]))
        self.assertEqual("attested", await self._state(agent))

    async def test_mode_survives_a_restart(self) -> None:
        agent, _ = await self._enrol()
        self.assertEqual("push", self.row(agent.uuid).attestation_mode)  # type: ignore[union-attr]

    async def test_v_sent_before_a_delete_is_not_taken_as_the_new_enrolments(
        self,
    ) -> None:
        """A node deleted while its V was on the way, then enrolled again:
        its agent's word that it holds a V (of its earlier bootstrap) does
        not stand for the new V, which is sent."""
        agent, _ = await self._enrol()
        token = await self._token(agent)
        post = await self._evidence(agent, token, await self._challenge(agent, token))
        post["v_held"] = False
        status, result = await self._post(
            f"/v1/push/{agent.uuid}/evidence", post, token
        )
        self.assertEqual((200, "bootstrapping"), (status, result["state"]), result)
        self.assertIsNotNone(result["v"])  # on its way
        await self.verifier.commands.delete(agent.uuid)
        v_share = os.urandom(32)
        await self.verifier.commands.enrol(
            agent.uuid, v_share, self.policy, mode="push"
        )
        self.quiesce(self.verifier)
        self.now += 2.0
        token = await self._token(agent)
        post = await self._evidence(agent, token, await self._challenge(agent, token))
        post["v_held"] = True  # bootstrapped by an earlier enrolment
        status, result = await self._post(
            f"/v1/push/{agent.uuid}/evidence", post, token
        )
        self.assertEqual(200, status, result)
        self.assertIsNotNone(result["v"], result)
        self.assertEqual(v_share, agent.open_v(result["v"]))
        self.assertEqual("bootstrapping", await self._state(agent))


class EnrolmentModeTest(VerifierServiceBase):
    def test_enrolment_mode_defaults_to_pull_and_round_trips(self) -> None:
        policy = PcrPolicy({16: frozenset({bytes(32)})})
        uuid = "6f1d7a2e-0f4b-4c1e-9a57-1d2e3f405161"
        plain = EnrolmentRequest(uuid, os.urandom(32), policy, u_commitment=bytes(32))
        body = plain.to_dict()
        del body["mode"]
        self.assertEqual("pull", EnrolmentRequest.from_dict(body).mode)
        push = EnrolmentRequest(
            uuid, os.urandom(32), policy, mode="push", u_commitment=bytes(32)
        )
        self.assertEqual(push, EnrolmentRequest.from_dict(push.to_dict()))

    def test_unknown_mode_is_refused(self) -> None:
        policy = PcrPolicy({16: frozenset({bytes(32)})})
        body = EnrolmentRequest(
            "6f1d7a2e-0f4b-4c1e-9a57-1d2e3f405161",
            os.urandom(32),
            policy,
            u_commitment=bytes(32),
        ).to_dict()
        body["mode"] = "sideways"
        self.assertRaises(MalformedError, EnrolmentRequest.from_dict, body)


class AgentPushLoopTest(VerifierServiceBase):
    """node_agent.push.PushLoop (the real agent, on a SoftTpm) against the
    real push endpoint: bootstrap by push, then revocation."""

    async def asyncSetUp(self) -> None:
        from node_agent.agent import Agent, TpmAccess
        from node_agent.tests.unit.test_agent import SoftTpmAdapter
        from verifier.common.http import AsyncClient

        self.now = T0
        self.fake = self.new_agent()  # registered; its SoftTpm backs the agent
        self.agent = Agent(
            self.fake.uuid,
            TpmAccess(lambda: SoftTpmAdapter(self.fake.tpm), shared=True),
            os.path.join(self.tmp, "agent"),
        )
        self.http = AsyncClient(None, 10.0)
        self.addAsyncCleanup(self.http.close)
        await self._serve()

    async def _serve(self, abe: Any = None) -> None:
        """A verifier (with the CP-ABE authority ``abe``) and its push
        endpoint, which the agent's push loop talks to."""
        from node_agent.evidence import EvidenceReader
        from node_agent.push import PushLoop

        self.verifier = Verifier(
            self.engine,
            self.signing_key,
            self.registrar,  # type: ignore[arg-type]
            self.agents,  # type: ignore[arg-type]
            Outbox(self.engine, [self.notifier]),
            self.ca,
            VerifierSettings(interval=2.0, push_rules=RULES),
            clock=lambda: self.now,
            abe=abe,
        )
        self.verifiers.append(self.verifier)
        server = LeanTestServer(make_push_app(self.verifier.push))
        await server.start_server()
        self.addAsyncCleanup(server.close)
        url = str(server.make_url("/"))
        self.loop = PushLoop(self.agent, EvidenceReader(None, None), url, self.http)

    async def test_agent_posts_at_its_nodes_own_interval(self) -> None:
        await self.verifier.commands.enrol(
            self.fake.uuid, os.urandom(32), self.policy, mode="push", interval=45.0
        )
        self.quiesce(self.verifier)
        sleeps: list[float] = []

        async def sleep(delay: float) -> None:
            sleeps.append(delay)
            if len(sleeps) == 2:
                raise asyncio.CancelledError  # two rounds are enough
            self.now += delay

        self.loop._sleep = sleep
        with contextlib.suppress(asyncio.CancelledError):
            await self.loop.run()
        self.assertEqual([45.0, 45.0], sleeps)
        self.assertEqual(45.0, self.loop.interval)
        view = await self.verifier.queries.get(self.fake.uuid)
        self.assertEqual((2, 45.0), (view.quotes_verified, view.interval))

    async def test_agent_bootstraps_by_push_and_stops_when_revoked(self) -> None:
        from verifier.protocol import generate_key, seal_payload, seal_share, split

        key = generate_key()
        u, v = split(key)
        await self.verifier.commands.enrol(self.fake.uuid, v, self.policy, mode="push")
        self.quiesce(self.verifier)
        nk = self.agent.nk_public
        envelope = seal_payload(key, b"not a script", self.fake.uuid)
        await self.agent.receive_u(seal_share(nk, u, "U", self.fake.uuid), envelope)
        result = await self.loop.round()
        # V came with the answer; attested once the agent says it holds it
        self.assertEqual("bootstrapping", result.state)
        self.assertTrue(self.agent.bootstrapped)
        self.now += 2.0
        self.assertEqual("attested", (await self.loop.round()).state)
        self.assertTrue(
            os.path.exists(os.path.join(self.agent.work_dir, "identity.pem"))
        )
        self.now += 2.0
        self.assertEqual("attested", (await self.loop.round()).state)
        self.assertEqual(
            3, (await self.verifier.queries.get(self.fake.uuid)).quotes_verified
        )
        self.fake.tpm.extend(16, b"\x02" * 32)
        self.now += 2.0
        sleeps: list[float] = []

        async def sleep(delay: float) -> None:
            sleeps.append(delay)

        self.loop._sleep = sleep
        await self.loop.run()  # returns: the node is revoked
        self.assertEqual("revoked", self.loop.state)
        self.assertEqual(
            "revoked", (await self.verifier.queries.get(self.fake.uuid)).state
        )

    async def test_v_is_sent_again_when_the_answer_carrying_it_is_lost(
        self,
    ) -> None:
        from node_agent.push import PushExchangeError
        from verifier.protocol import generate_key, seal_payload, seal_share, split

        key = generate_key()
        u, v = split(key)
        await self.verifier.commands.enrol(self.fake.uuid, v, self.policy, mode="push")
        self.quiesce(self.verifier)
        nk = self.agent.nk_public
        envelope = seal_payload(key, b"not a script", self.fake.uuid)
        await self.agent.receive_u(seal_share(nk, u, "U", self.fake.uuid), envelope)
        real, lost = self.loop._post, []

        async def lossy(path: str, body: Any = None, token: bool = False) -> Any:
            answer = await real(path, body, token=token)
            if path == "/evidence" and not lost:  # judged, then lost on the way
                lost.append(answer)
                raise PushExchangeError("transport", "connection reset")
            return answer

        self.loop._post = lossy  # type: ignore[method-assign]
        with self.assertRaises(PushExchangeError):
            await self.loop.round()
        self.assertIsNotNone(lost[0]["v"])  # the lost answer carried V
        self.assertFalse(self.agent.holds_v)
        self.assertEqual(
            "bootstrapping", (await self.verifier.queries.get(self.fake.uuid)).state
        )
        self.now += 2.0
        result = await self.loop.round()  # V again, with the next good evidence
        self.assertIsNotNone(result.v)
        self.assertTrue(self.agent.bootstrapped)
        self.assertEqual("bootstrapping", result.state)
        self.now += 2.0
        result = await self.loop.round()  # the agent says it holds V
        self.assertEqual(("attested", None), (result.state, result.v))
        row = self.row(self.fake.uuid)
        assert row is not None
        self.assertIsNotNone(row.identity_cert)

    async def test_cp_abe_key_comes_with_the_answer_to_good_evidence(self) -> None:
        import json

        from node_agent.abe import AbeKeyring
        from verifier.attest.abe_keys import AbeAuthority, ProviderAttributes

        attrs = os.path.join(self.tmp, "attrs.json")
        with open(attrs, "w", encoding="utf-8") as f:
            json.dump({self.fake.uuid: {"region": "eu"}}, f)
        abe = AbeAuthority(
            os.path.join(self.tmp, "abe", "master.key"),
            ProviderAttributes(attrs),
            self.agents,  # type: ignore[arg-type]
        )
        await self._serve(abe)  # the authority is given at construction
        keyring = AbeKeyring(self.agent)
        self.loop._on_abe = lambda d: keyring.receive(d.key, d.params, d.epoch)
        await self.verifier.commands.enrol(  # keys go only to nodes of a project
            self.fake.uuid, os.urandom(32), self.policy, project="p1", mode="push"
        )
        self.quiesce(self.verifier)
        first = await self.loop.round()
        self.assertIsNotNone(first.abe)
        keys = keyring.describe()["keys"]
        self.assertEqual(1, len(keys))
        self.assertIn("region=eu", keys[0]["attributes"])
        self.assertIn("project=p1", keys[0]["attributes"])
        self.now += 2.0
        self.assertIsNone((await self.loop.round()).abe)  # it holds it already
        self.assertEqual([], self.fake.v_posts)  # nothing went to the agent's port
