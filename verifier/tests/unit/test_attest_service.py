"""The verifier service (``verifier.attest.service.Verifier``) end to end,
hermetically: a temp-file SQLite database, a fake registrar and fake node
agents backed by :class:`SoftTpm` that produce real quotes, an X25519
share-transport key (NK) and a P-256 CSR, exactly as ``node_agent`` does.

Every test drives ``attest_once`` itself; the loop task that ``enrol``
schedules is cancelled before it ever runs.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import tempfile
import unittest
import uuid as uuid_mod
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import sqlalchemy as sa
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, x25519
from cryptography.x509.oid import NameOID
from oslo_config import cfg
from sqlalchemy.orm import Session

from trusted_testing.softtpm import SoftTpm
from verifier.attest.service import Verifier
from verifier.attest.settings import VerifierSettings
from verifier.ca import CertificateAuthority
from verifier.common.tls import self_signed_certificate
from verifier.db import Node, OutboxEvent, make_engine, upgrade
from verifier.exceptions import AgentUnreachableError, ConflictError, NotFoundError
from verifier.notify import Notifier, Outbox
from verifier.protocol import (
    MalformedError,
    PcrPolicy,
    SignedEvent,
    bind_nonce,
    open_share,
)
from verifier.protocol.messages.registration import RegistrationRecord

_RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw
#: The pinned TLS certificate of every fake agent (a real one: the
#: registrar record refuses anything else).
_TLS_CERT = self_signed_certificate("fake-agent", ["192.0.2.10"])[1].decode()
_SPKI = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
MEASUREMENT = hashlib.sha256(b"trusted boot chain").digest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- fakes -------------------------------------------------------------------


class FakeAgent:
    """One node agent: a SoftTpm, an NK and a CSR key, plus fault switches.

    Switches:
        unreachable: every request raises AgentUnreachableError.
        reject_v: POST /v1/keys/v raises AgentUnreachableError (e.g. 409).
        answer_hook: mutates the quote answer (bad shapes).
        not_json: answers quotes with a body that is not JSON (the client
            raises MalformedError, as VerifierAgentClient does).
        v_not_json: answers POST /v1/keys/v that way.
        nk_override: the NK the agent hands out (and binds in its quote).
        before_answer: awaited before a quote answer is returned.
        take_u: answers POST /v1/keys/u (the tenant's U relayed by the
            verifier); None: record it and answer ``bootstrapped: false``.
    """

    def __init__(self, node_uuid: str, port: int) -> None:
        self.uuid = node_uuid
        self.host = "192.0.2.10"
        self.port = port
        self.tls_cert = _TLS_CERT
        self.tpm = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        self.tpm.extend(16, MEASUREMENT)
        self.nk = x25519.X25519PrivateKey.generate()
        self.nk_public = self.nk.public_key().public_bytes(*_RAW)
        self.identity_key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ignored")])
        self.csr_der = (
            x509.CertificateSigningRequestBuilder()
            .subject_name(subject)
            .sign(self.identity_key, hashes.SHA256())
            .public_bytes(serialization.Encoding.DER)
        )
        self.unreachable = False
        self.reject_v = False
        self.not_json = False
        self.v_not_json = False
        self.answer_hook: Callable[[dict[str, Any]], None] | None = None
        self.nk_override: bytes | None = None
        self.before_answer: Callable[[], Awaitable[None]] | None = None
        self.quote_requests: list[dict[str, str]] = []
        self.v_posts: list[Mapping[str, Any]] = []
        self.u_posts: list[Mapping[str, Any]] = []
        self.take_u: Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]] | None = (
            None
        )

    @property
    def base_url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def record(self, activated: bool = True) -> dict[str, Any]:
        """What the registrar answers for this node."""
        return {
            "uuid": self.uuid,
            "ak_public": _b64(self.tpm.ak.to_bytes()),
            "ek_public": _b64(self.tpm.ek.to_bytes()),
            "tls_cert": self.tls_cert,
            "host": self.host,
            "port": self.port,
            "activated": activated,
        }

    def open_v(self, post: Mapping[str, Any]) -> bytes:
        envelope = base64.b64decode(post["v"], validate=True)
        return open_share(self.nk, envelope, "V", self.uuid)

    async def quote(self, params: Mapping[str, str]) -> dict[str, Any]:
        self.quote_requests.append(dict(params))
        nonce = bytes.fromhex(params["nonce"])
        pcrs = tuple(int(p) for p in params["pcrs"].split(","))
        nk = self.nk_public if self.nk_override is None else self.nk_override
        with_csr = params.get("csr") == "1"
        bound = (nk, self.csr_der) if with_csr else (nk,)
        quote = self.tpm.quote(bind_nonce(nonce, *bound), pcrs)
        answer: dict[str, Any] = {"quote": quote.to_dict(), "nk": _b64(nk)}
        if with_csr:
            answer["csr"] = _b64(self.csr_der)
        if self.answer_hook is not None:
            self.answer_hook(answer)
        if self.before_answer is not None:
            await self.before_answer()
        return answer


class FakeAgents:
    """Stands in for ``VerifierAgentClient``: routes requests to FakeAgent objects."""

    def __init__(self, *agents: FakeAgent) -> None:
        self.agents = {a.base_url: a for a in agents}
        self.closed = False
        self.forgotten: list[str] = []

    def add(self, agent: FakeAgent) -> None:
        self.agents[agent.base_url] = agent

    async def call(
        self,
        method: str,
        base: str,
        agent_cert: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> Mapping[str, Any]:
        agent = self.agents.get(base)
        if agent is None or agent.unreachable:
            raise AgentUnreachableError(f"agent {base} unreachable: refused")
        if agent_cert != agent.tls_cert:
            raise AgentUnreachableError(f"agent {base}: certificate pin mismatch")
        if method == "GET" and path == "/v1/quote":
            assert params is not None
            if agent.not_json:
                raise MalformedError("agent answer", "response is not JSON")
            return await agent.quote(params)
        if method == "POST" and path == "/v1/keys/v":
            assert body is not None
            if agent.reject_v:
                raise AgentUnreachableError("agent answered 409 to /v1/keys/v")
            agent.v_posts.append(dict(body))
            if agent.v_not_json:
                raise MalformedError("agent answer", "response is not JSON")
            return {"bootstrapped": False}
        if method == "POST" and path == "/v1/keys/u":
            assert body is not None
            agent.u_posts.append(dict(body))
            if agent.take_u is not None:
                return await agent.take_u(body)
            return {"accepted": "u", "bootstrapped": False}
        raise AgentUnreachableError(f"agent answered 404 to {path}")

    def forget(self, base: str, agent_cert: str) -> None:
        self.forgotten.append(base)

    def rest(self, base: str, delay: float) -> None:
        pass

    async def close(self) -> None:
        self.closed = True


class FakeRegistrar:
    """Stands in for ``RegistrarClient``."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}
        self.placements: dict[str, str] = {}
        self.lookups: list[list[str]] = []  # each batch look-up's nodes

    def add(self, agent: FakeAgent, activated: bool = True) -> None:
        self.records[agent.uuid] = agent.record(activated)

    async def placement(self, node_uuid: str) -> str | None:
        return self.placements.get(node_uuid)

    async def get_agent(self, node_uuid: str) -> RegistrationRecord:
        record = self.records.get(node_uuid)
        if record is None:
            raise NotFoundError(
                "unknown_node", f"the registrar does not know node {node_uuid}"
            )
        return RegistrationRecord.from_dict(record)

    async def lookup(
        self, uuids: list[str]
    ) -> tuple[dict[str, RegistrationRecord], dict[str, str]]:
        self.lookups.append(list(uuids))
        records = {u: await self.get_agent(u) for u in uuids if u in self.records}
        return records, {u: h for u, h in self.placements.items() if u in uuids}

    async def close(self) -> None:
        pass


class RecordingNotifier(Notifier):
    """Records what it is given; ``mode`` is "ack", "nack" or "raise"."""

    name = "recording"

    def __init__(self, public_key: ed25519.Ed25519PublicKey, mode: str = "ack"):
        super().__init__(cfg.ConfigOpts(), public_key)
        self.mode = mode
        self.events: list[Mapping[str, Any]] = []

    def _deliver(self, event: Mapping[str, Any]) -> bool:
        self.events.append(event)
        if self.mode == "raise":
            raise RuntimeError("consumer is down")
        return self.mode == "ack"


# -- the test case -------------------------------------------------------------


class VerifierServiceBase(unittest.IsolatedAsyncioTestCase):
    """Fakes and helpers, no tests (other modules build on it)."""

    def setUp(self) -> None:
        # A stopped verifier's write cancelled while on a worker thread
        # (asyncio.to_thread) still finishes there, and may create the
        # SQLite journal while the directory is being removed (seen once:
        # "Directory not empty"): that is not the test's failure.
        tmp = tempfile.TemporaryDirectory(ignore_cleanup_errors=True)
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name
        self.engine = make_engine("sqlite:///" + os.path.join(self.tmp, "v.db"))
        self.addCleanup(self.engine.dispose)
        upgrade(self.engine)
        self.signing_key = ed25519.Ed25519PrivateKey.generate()
        self.public_key = self.signing_key.public_key()
        self.ca = CertificateAuthority.create(os.path.join(self.tmp, "ca"), "test CA")
        self.registrar = FakeRegistrar()
        self.agents = FakeAgents()
        self.notifier = RecordingNotifier(self.public_key)
        self.policy = PcrPolicy({16: frozenset({self._good_pcr16()})})
        self.verifiers: list[Verifier] = []
        self._ports = iter(range(9000, 9100))

    async def asyncTearDown(self) -> None:
        for verifier in self.verifiers:
            await verifier.stop()

    @staticmethod
    def _good_pcr16() -> bytes:
        return hashlib.sha256(bytes(32) + MEASUREMENT).digest()

    def new_verifier(
        self, notifiers: list[Notifier] | None = None, **parts: Any
    ) -> Verifier:
        """A verifier on this test's database, stopped at tear-down;
        ``parts`` are Verifier's keyword parts (``ownership``,
        ``policies``...)."""
        outbox = Outbox(
            self.engine, [self.notifier] if notifiers is None else notifiers
        )
        verifier = Verifier(
            self.engine,
            self.signing_key,
            self.registrar,  # type: ignore[arg-type]
            self.agents,  # type: ignore[arg-type]
            outbox,
            self.ca,
            VerifierSettings(interval=0.01, max_unreachable=3),
            **parts,
        )
        self.verifiers.append(verifier)
        return verifier

    def new_agent(self, activated: bool = True) -> FakeAgent:
        agent = FakeAgent(str(uuid_mod.uuid4()), next(self._ports))
        self.agents.add(agent)
        self.registrar.add(agent, activated)
        return agent

    @staticmethod
    def quiesce(verifier: Verifier) -> None:
        """Cancel the loop tasks (before they ever ran): tests drive
        ``attest_once`` themselves."""
        verifier.pause_attestation()

    async def enrol(
        self, verifier: Verifier, agent: FakeAgent, v_share: bytes | None = None
    ) -> bytes:
        v_share = os.urandom(32) if v_share is None else v_share
        view = await verifier.commands.enrol(agent.uuid, v_share, self.policy)
        self.quiesce(verifier)
        self.assertEqual("registered", view.state)
        return v_share

    def row(self, node_uuid: str) -> Node | None:
        with Session(self.engine) as session:
            row = session.get(Node, node_uuid)
            if row is not None:
                session.expunge(row)
            return row

    def outbox_rows(self) -> list[OutboxEvent]:
        with Session(self.engine) as session:
            rows = list(session.scalars(sa.select(OutboxEvent)))
            for row in rows:
                session.expunge(row)
            return rows

    def assert_signed_event(
        self, row: OutboxEvent, node_uuid: str, reason: str
    ) -> None:
        signed = SignedEvent.from_dict(json.loads(row.body))
        event = signed.verify(self.public_key)
        self.assertEqual(node_uuid, event.node_uuid)
        self.assertEqual(reason, event.reason)
        self.assertEqual(node_uuid, row.node_uuid)

    def assert_identity_cert(self, agent: FakeAgent, pem: str) -> None:
        cert = x509.load_pem_x509_certificate(pem.encode())
        self.assertEqual(
            agent.identity_key.public_key().public_bytes(*_SPKI),
            cert.public_key().public_bytes(*_SPKI),
        )
        cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        self.assertEqual([agent.uuid], [a.value for a in cns])
        self.assertEqual(self.ca.cert.subject, cert.issuer)


class VerifierServiceTest(VerifierServiceBase):
    # -- enrolment ----------------------------------------------------------

    async def test_enrol_not_activated_is_refused_and_nothing_stored(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent(activated=False)
        with self.assertRaises(ConflictError) as ctx:
            await verifier.commands.enrol(agent.uuid, os.urandom(32), self.policy)
        self.assertEqual("ak_not_activated", ctx.exception.code)
        self.assertIsNone(self.row(agent.uuid))
        self.assertEqual([], await verifier.queries.list())
        with self.assertRaises(NotFoundError):
            await verifier.queries.get(agent.uuid)

    async def test_enrol_twice_conflicts(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        v_share = await self.enrol(verifier, agent)
        with self.assertRaises(ConflictError) as ctx:
            await verifier.commands.enrol(
                agent.uuid.upper(), os.urandom(32), self.policy
            )
        self.assertEqual("already_enrolled", ctx.exception.code)
        row = self.row(agent.uuid)
        assert row is not None
        self.assertEqual(v_share, row.v_share)

    async def test_enrol_unknown_at_registrar_propagates_not_found(self) -> None:
        verifier = self.new_verifier()
        with self.assertRaises(NotFoundError):
            await verifier.commands.enrol(
                str(uuid_mod.uuid4()), os.urandom(32), self.policy
            )
        self.assertEqual([], await verifier.queries.list())

    async def test_enrol_stores_row(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        v_share = await self.enrol(verifier, agent)
        row = self.row(agent.uuid)
        assert row is not None
        self.assertEqual("registered", row.state)
        self.assertEqual(agent.tpm.ak.to_bytes(), row.ak_public)
        self.assertEqual((agent.host, agent.port), (row.host, row.port))
        self.assertEqual(v_share, row.v_share)
        self.assertFalse(row.v_released)
        self.assertEqual([agent.uuid], [v.uuid for v in await verifier.queries.list()])

    # -- V release ----------------------------------------------------------

    async def test_first_valid_quote_releases_v_once(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        v_share = await self.enrol(verifier, agent)

        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state)
        self.assertEqual(1, view.quotes_verified)
        self.assertIsNotNone(view.last_attested_at)
        self.assertEqual("1", agent.quote_requests[0]["csr"])
        self.assertEqual("16", agent.quote_requests[0]["pcrs"])
        self.assertEqual(1, len(agent.v_posts))
        self.assertEqual(v_share, agent.open_v(agent.v_posts[0]))
        self.assert_identity_cert(agent, agent.v_posts[0]["identity_cert"])
        row = self.row(agent.uuid)
        assert row is not None
        self.assertEqual("attested", row.state)
        self.assertTrue(row.v_released)
        self.assertEqual(agent.v_posts[0]["identity_cert"], row.identity_cert)

        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state)
        self.assertEqual(2, view.quotes_verified)
        self.assertEqual("0", agent.quote_requests[1]["csr"])
        self.assertEqual(1, len(agent.v_posts))
        self.assertEqual([], self.outbox_rows())

    async def test_v_not_delivered_is_retried(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        v_share = await self.enrol(verifier, agent)
        agent.reject_v = True
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("bootstrapping", view.state)
        agent.reject_v = False
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state)
        self.assertEqual("1", agent.quote_requests[1]["csr"])
        self.assertEqual(1, len(agent.v_posts))
        self.assertEqual(v_share, agent.open_v(agent.v_posts[0]))

    async def test_unreachable_before_first_quote_still_gets_v(self) -> None:
        # Regression: a node marked unreachable before its first valid
        # quote must still be sent V when it comes back.
        verifier = self.new_verifier()
        agent = self.new_agent()
        v_share = await self.enrol(verifier, agent)
        agent.unreachable = True
        for _ in range(3):
            view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("unreachable", view.state)
        self.assertTrue(view.failure_reason.startswith("unreachable"))
        agent.unreachable = False

        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state)
        self.assertIsNone(view.failure_reason)
        self.assertEqual("1", agent.quote_requests[-1]["csr"])
        self.assertEqual(1, len(agent.v_posts))
        self.assertEqual(v_share, agent.open_v(agent.v_posts[0]))
        self.assert_identity_cert(agent, agent.v_posts[0]["identity_cert"])
        row = self.row(agent.uuid)
        assert row is not None
        self.assertTrue(row.v_released)
        self.assertEqual("attested", row.state)

    # -- unreachable --------------------------------------------------------

    async def test_unreachable_never_revokes(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        await verifier.rounds.attest_once(agent.uuid)
        agent.unreachable = True
        for i in range(10):
            view = await verifier.rounds.attest_once(agent.uuid)
            expected = "unreachable" if i >= 2 else "attested"
            self.assertEqual(expected, view.state, f"round {i}")
        row = self.row(agent.uuid)
        assert row is not None
        self.assertEqual("unreachable", row.state)
        self.assertIn("unreachable", row.failure_reason)
        # leaving attested is signed (node.unreachable), once (issue 18)
        (event_row,) = self.outbox_rows()
        self.assert_signed_event(event_row, agent.uuid, "unreachable")

        agent.unreachable = False
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state)
        self.assertIsNone(view.failure_reason)
        self.assertEqual(2, view.quotes_verified)
        self.assertEqual("0", agent.quote_requests[-1]["csr"])
        self.assertEqual(1, len(agent.v_posts))
        row = self.row(agent.uuid)
        assert row is not None
        self.assertEqual("attested", row.state)
        self.assertIsNone(row.failure_reason)
        # coming back is signed too (node.recovered), and nothing revoked
        rows = self.outbox_rows()
        self.assertEqual(2, len(rows))
        self.assert_signed_event(rows[1], agent.uuid, "recovered")

    async def test_unreachable_node_shows_the_latest_failure_reason(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        await verifier.rounds.attest_once(agent.uuid)
        agent.unreachable = True
        for _ in range(5):
            view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("unreachable", view.state)
        self.assertIn("refused", view.failure_reason)
        # The agent is back but with another TLS certificate: the reason
        # shown and stored is the pin mismatch of this round.
        agent.unreachable = False
        agent.tls_cert = "another certificate"
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("unreachable", view.state)
        self.assertIn("certificate pin mismatch", view.failure_reason)
        row = self.row(agent.uuid)
        assert row is not None
        self.assertIn("certificate pin mismatch", row.failure_reason)

    # -- revocation ---------------------------------------------------------

    async def test_pcr_mismatch_revokes_with_signed_event(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        await verifier.rounds.attest_once(agent.uuid)
        agent.tpm.extend(16, hashlib.sha256(b"rootkit").digest())

        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("revoked", view.state)
        self.assertTrue(view.failure_reason.startswith("pcr_policy:"))
        row = self.row(agent.uuid)
        assert row is not None
        self.assertEqual("revoked", row.state)
        self.assertTrue(row.failure_reason.startswith("pcr_policy:"))
        (event_row,) = self.outbox_rows()
        self.assert_signed_event(event_row, agent.uuid, "pcr_policy")
        self.assertIsNone(event_row.delivered_at)

        self.assertEqual(1, verifier.outbox.dispatch_once())
        self.assertEqual(1, len(self.notifier.events))
        self.assertEqual(json.loads(event_row.body), self.notifier.events[0])
        (event_row,) = self.outbox_rows()
        self.assertIsNotNone(event_row.delivered_at)
        self.assertEqual(1, event_row.attempts)
        self.assertIsNone(event_row.last_error)
        self.assertEqual(0, verifier.outbox.dispatch_once())
        self.assertEqual(1, len(self.notifier.events))

        asked = len(agent.quote_requests)
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("revoked", view.state)
        self.assertEqual(asked, len(agent.quote_requests))
        self.assertEqual(1, len(self.outbox_rows()))

    async def test_pcr_mismatch_on_first_quote_never_releases_v(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        agent.tpm.extend(16, b"\x01" * 32)
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("revoked", view.state)
        self.assertEqual([], agent.v_posts)
        (event_row,) = self.outbox_rows()
        self.assert_signed_event(event_row, agent.uuid, "pcr_policy")

    def _malformed(self, hook: Callable[[dict[str, Any]], None]) -> Any:
        async def run() -> None:
            verifier = self.new_verifier()
            agent = self.new_agent()
            await self.enrol(verifier, agent)
            agent.answer_hook = hook
            view = await verifier.rounds.attest_once(agent.uuid)
            self.assertEqual("revoked", view.state)
            self.assertTrue(
                view.failure_reason.startswith("malformed:"), view.failure_reason
            )
            self.assertEqual([], agent.v_posts)
            (event_row,) = self.outbox_rows()
            self.assert_signed_event(event_row, agent.uuid, "malformed")

        return run()

    async def test_answer_without_nk_revokes_malformed(self) -> None:
        await self._malformed(lambda a: a.pop("nk"))

    async def test_answer_with_non_base64_nk_revokes_malformed(self) -> None:
        await self._malformed(lambda a: a.update(nk="not base64 !!!"))

    async def test_answer_with_non_string_nk_revokes_malformed(self) -> None:
        await self._malformed(lambda a: a.update(nk=12345))

    async def test_answer_without_quote_revokes_malformed(self) -> None:
        await self._malformed(lambda a: a.pop("quote"))

    async def test_answer_with_non_base64_attest_revokes_malformed(self) -> None:
        await self._malformed(lambda a: a["quote"].update(attest="%%%"))

    async def test_answer_without_csr_on_first_quote_revokes_malformed(self) -> None:
        await self._malformed(lambda a: a.pop("csr"))

    async def test_answer_that_is_not_json_revokes_malformed(self) -> None:
        # An agent answering 200 with a body that is not JSON is judged
        # like any unparseable answer: revoked, not left as it was.
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        await verifier.rounds.attest_once(agent.uuid)
        agent.not_json = True
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("revoked", view.state)
        self.assertIn("not JSON", view.failure_reason)
        (event_row,) = self.outbox_rows()
        self.assert_signed_event(event_row, agent.uuid, "malformed")

    async def test_v_delivery_answered_not_json_revokes_malformed(self) -> None:
        # The agent takes V but answers with a body that is not JSON: the
        # node fails closed (revoked, signed event), never left bootstrapping
        # with the error escaping the quote loop.
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        agent.v_not_json = True
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("revoked", view.state)
        self.assertIn("not JSON", view.failure_reason)
        (event_row,) = self.outbox_rows()
        self.assert_signed_event(event_row, agent.uuid, "malformed")

    async def test_short_nk_bound_in_quote_revokes_malformed(self) -> None:
        # The agent binds an NK that is not a 32-byte X25519 key into an
        # otherwise valid quote. V cannot be sealed to it: the node must be
        # revoked as malformed (not crash attest_once and stay
        # bootstrapping forever).
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        agent.nk_override = b"\x01" * 5
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("revoked", view.state)
        self.assertTrue(view.failure_reason.startswith("malformed:"))
        self.assertEqual([], agent.v_posts)

    async def test_nonce_mismatch_revokes(self) -> None:
        # The NK handed over is not the one bound in the quote.
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        other = x25519.X25519PrivateKey.generate().public_key().public_bytes(*_RAW)
        agent.answer_hook = lambda a: a.update(nk=_b64(other))
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("revoked", view.state)
        self.assertTrue(view.failure_reason.startswith("nonce_mismatch:"))
        self.assertEqual([], agent.v_posts)

    async def test_tenant_revoke_during_inflight_quote_sticks(self) -> None:
        # The tenant revokes while the node's first quote is in flight: the
        # quote's verdict must not un-revoke the node nor release V to it.
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)

        async def tenant_revokes() -> None:
            await verifier.commands.revoke(
                agent.uuid, "tenant_revoked", "by the tenant"
            )

        agent.before_answer = tenant_revokes
        view = await verifier.rounds.attest_once(agent.uuid)
        row = self.row(agent.uuid)
        assert row is not None
        self.assertEqual(
            ("revoked", "revoked", False, 0),
            (view.state, row.state, row.v_released, len(agent.v_posts)),
        )

    # -- outbox delivery ----------------------------------------------------

    async def _revoked_node(self, verifier: Verifier) -> FakeAgent:
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        agent.tpm.extend(16, b"\x02" * 32)
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("revoked", view.state)
        return agent

    async def _failing_notifier_then_delivery(self, mode: str, error: str) -> None:
        failing = RecordingNotifier(self.public_key, mode)
        verifier = self.new_verifier([failing])
        agent = await self._revoked_node(verifier)
        for attempt in (1, 2):
            self.assertEqual(0, verifier.outbox.dispatch_once())
            (row,) = self.outbox_rows()
            self.assertIsNone(row.delivered_at)
            self.assertEqual(attempt, row.attempts)
            self.assertIn(error, row.last_error)
        self.assertEqual(2, len(failing.events))

        working = Outbox(self.engine, [self.notifier])
        self.assertEqual(1, working.dispatch_once())
        (row,) = self.outbox_rows()
        self.assertIsNotNone(row.delivered_at)
        self.assertEqual(3, row.attempts)
        self.assertIsNone(row.last_error)
        (event,) = self.notifier.events
        self.assertEqual(agent.uuid, event["event"]["node_uuid"])
        self.assertEqual(0, working.dispatch_once())
        listed = working.list(agent.uuid)
        self.assertEqual([True], [e["delivered"] for e in listed])

    async def test_notifier_raising_leaves_event_undelivered(self) -> None:
        await self._failing_notifier_then_delivery("raise", "consumer is down")

    async def test_notifier_not_acking_leaves_event_undelivered(self) -> None:
        await self._failing_notifier_then_delivery("nack", "not acknowledged")

    # -- tenant operations --------------------------------------------------

    async def test_tenant_revoke_writes_event(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        await verifier.rounds.attest_once(agent.uuid)
        view = await verifier.commands.revoke(agent.uuid, "tenant_revoked", "job done")
        self.assertEqual("revoked", view.state)
        self.assertEqual("tenant_revoked: job done", view.failure_reason)
        (event_row,) = self.outbox_rows()
        self.assert_signed_event(event_row, agent.uuid, "tenant_revoked")
        row = self.row(agent.uuid)
        assert row is not None
        self.assertEqual("revoked", row.state)
        # Revoking again is idempotent: no second event.
        await verifier.commands.revoke(agent.uuid, "tenant_revoked", "again")
        self.assertEqual(1, len(self.outbox_rows()))
        asked = len(agent.quote_requests)
        await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual(asked, len(agent.quote_requests))

    async def test_delete_forgets_node(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        await verifier.rounds.attest_once(agent.uuid)
        await verifier.commands.revoke(agent.uuid, "tenant_revoked", "bye")
        await verifier.commands.delete(agent.uuid)
        self.assertIsNone(self.row(agent.uuid))
        self.assertEqual([agent.base_url], self.agents.forgotten)  # connection closed
        with self.assertRaises(NotFoundError):
            await verifier.queries.get(agent.uuid)
        with self.assertRaises(NotFoundError):
            await verifier.rounds.attest_once(agent.uuid)
        with self.assertRaises(NotFoundError):
            await verifier.commands.delete(agent.uuid)
        self.assertEqual([], await verifier.queries.list())
        # The outbox event outlives the node.
        self.assertEqual(1, len(self.outbox_rows()))
        # And the node can be enrolled again.
        await self.enrol(verifier, agent)

    # -- persistence and restart --------------------------------------------

    async def _attested_and_flushed(self) -> tuple[Verifier, FakeAgent, bytes]:
        verifier = self.new_verifier()
        agent = self.new_agent()
        v_share = await self.enrol(verifier, agent)
        for _ in range(4):
            view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state)
        self.assertEqual(4, view.quotes_verified)
        row = self.row(agent.uuid)
        assert row is not None
        # State changes are written at once; hot counters are written behind.
        self.assertEqual(1, row.quotes_verified)
        verifier.write_behind.flush()
        row = self.row(agent.uuid)
        assert row is not None
        self.assertEqual(4, row.quotes_verified)
        self.assertEqual(agent.tpm.clock, row.clock)
        self.assertEqual(agent.tpm.reset_count, row.reset_count)
        self.assertEqual(agent.tpm.restart_count, row.restart_count)
        self.assertIsNotNone(row.last_attested_at)
        return verifier, agent, v_share

    async def _restarted(self) -> Verifier:
        verifier = self.new_verifier()
        await verifier.start()
        self.quiesce(verifier)
        return verifier

    async def test_restart_keeps_clock_and_rejects_rollback(self) -> None:
        _, agent, _ = await self._attested_and_flushed()
        restarted = await self._restarted()
        view = await restarted.queries.get(agent.uuid)
        self.assertEqual("attested", view.state)
        self.assertEqual(4, view.quotes_verified)

        agent.tpm.clock -= 200  # the TPM's clock went backwards
        view = await restarted.rounds.attest_once(agent.uuid)
        self.assertEqual("revoked", view.state)
        self.assertTrue(view.failure_reason.startswith("clock_rollback:"))
        (event_row,) = self.outbox_rows()
        self.assert_signed_event(event_row, agent.uuid, "clock_rollback")

    async def test_restart_accepts_newer_clock(self) -> None:
        _, agent, _ = await self._attested_and_flushed()
        restarted = await self._restarted()
        view = await restarted.rounds.attest_once(agent.uuid)
        self.assertEqual(5, view.quotes_verified)
        self.assertEqual([], self.outbox_rows())

    async def test_restart_does_not_release_v_again(self) -> None:
        # V was released before the restart; the agent is bootstrapped and
        # (like the real agent) refuses a second V with 409. The restarted
        # verifier must keep the node attested and must not resend V.
        _, agent, _ = await self._attested_and_flushed()
        agent.reject_v = True
        restarted = await self._restarted()
        view = await restarted.rounds.attest_once(agent.uuid)
        self.assertEqual("attested", view.state)
        self.assertEqual("0", agent.quote_requests[-1]["csr"])
        self.assertEqual(1, len(agent.v_posts))
        row = self.row(agent.uuid)
        assert row is not None
        self.assertEqual("attested", row.state)

    async def test_stop_flushes_and_closes_clients(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        for _ in range(3):
            await verifier.rounds.attest_once(agent.uuid)
        await verifier.stop()
        self.verifiers.remove(verifier)
        self.assertTrue(self.agents.closed)
        row = self.row(agent.uuid)
        assert row is not None
        self.assertEqual(3, row.quotes_verified)

    async def test_restart_does_not_run_revoked_nodes(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        await verifier.commands.revoke(agent.uuid, "tenant_revoked", "bye")
        restarted = self.new_verifier()
        await restarted.start()
        # a revoked node is not loaded for attestation at all
        self.assertNotIn(agent.uuid, restarted.nodes)
        self.assertEqual("revoked", (await restarted.queries.get(agent.uuid)).state)
        await asyncio.sleep(0.05)
        self.assertEqual([], agent.quote_requests)

    # -- database outage: never revoke the healthy, never lose a revocation

    def _break_database(self, verifier: Verifier) -> sa.Engine:
        good = verifier.store.engine
        verifier.store.engine = sa.create_engine("sqlite:////nonexistent/dir/db")
        return good

    async def test_healthy_node_stays_attested_while_the_database_is_down(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        await verifier.rounds.attest_once(agent.uuid)
        good = self._break_database(verifier)
        for _ in range(3):
            view = await verifier.rounds.attest_once(agent.uuid)
            self.assertEqual("attested", view.state)
        self.assertRaises(sa.exc.OperationalError, verifier.write_behind.flush)
        verifier.store.engine = good
        verifier.write_behind.flush()
        self.assertEqual([], self.outbox_rows())

    async def test_revocation_during_outage_is_committed_once_when_back(self) -> None:
        verifier = self.new_verifier()
        agent = self.new_agent()
        await self.enrol(verifier, agent)
        await verifier.rounds.attest_once(agent.uuid)
        agent.tpm.extend(16, hashlib.sha256(b"rootkit").digest())
        good = self._break_database(verifier)
        with self.assertRaises(sa.exc.OperationalError):
            await verifier.rounds.attest_once(agent.uuid)
        self.assertNotEqual("revoked", verifier.nodes.live(agent.uuid).state)
        verifier.store.engine = good
        view = await verifier.rounds.attest_once(agent.uuid)
        self.assertEqual("revoked", view.state)
        (event_row,) = self.outbox_rows()
        self.assert_signed_event(event_row, agent.uuid, "pcr_policy")
