"""The key service's rules (no HTTP) and its REST API without TLS."""

import asyncio
import base64
import json
import os
import tempfile
import uuid

import testtools
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives.asymmetric import ed25519

from verifier.common import metrics
from verifier.exceptions import NotFoundError, RequestError
from verifier.keyservice import KeyService, make_app
from verifier.protocol import MalformedError, RevocationEvent
from verifier.protocol.capability import issue
from verifier.protocol.lkh import LkhMember, RekeyMessage

MAC_KEY = os.urandom(32)
EVENTS = ed25519.Ed25519PrivateKey.generate()
NOW = 1_700_000_000.0


def _event(node: str, kind: str = "node.revoked") -> dict:  # type: ignore[type-arg]
    event = RevocationEvent(
        str(uuid.uuid4()), node, "pcr_policy", "PCR 16", "2026-01-01T00:00:00Z", kind
    )
    return event.sign(EVENTS).to_dict()


def _token(
    node: str, obj: str, rights: str = "r", epoch: int = 0, project: str = ""
) -> str:
    return issue(
        MAC_KEY, node, obj, rights, int(NOW) + 60, epoch, os.urandom(16), project
    ).to_token()


class KeyServiceTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.state = os.path.join(tempfile.mkdtemp(), "ks.json")
        self.signer = ed25519.Ed25519PrivateKey.generate()
        self.svc = self._service()
        self.a, self.b = str(uuid.uuid4()), str(uuid.uuid4())

    def _service(self) -> KeyService:
        return KeyService(
            MAC_KEY, [EVENTS.public_key()], self.signer, self.state, clock=lambda: NOW
        )

    def test_revocation_bumps_epoch_once_per_event(self) -> None:
        event = _event(self.a)
        self.assertEqual(1, self.svc.revoke(event)["epoch"])
        self.assertTrue(self.svc.revoke(event)["duplicate"])
        self.assertEqual(1, self.svc.checker.epoch(self.a))

    def test_unreachable_bumps_the_epoch_and_recovered_does_not(self) -> None:
        self.assertEqual(
            1, self.svc.revoke(_event(self.a, "node.unreachable"))["epoch"]
        )
        self.assertEqual(1, self.svc.revoke(_event(self.a, "node.recovered"))["epoch"])
        self.assertEqual(1, self.svc.checker.epoch(self.a))

    def test_policy_changed_does_not_bump_the_epoch(self) -> None:
        answer = self.svc.revoke(_event(self.a, "node.policy_changed"))
        self.assertEqual((0, False), (answer["epoch"], answer["duplicate"]))
        self.assertEqual(0, self.svc.checker.epoch(self.a))

    def test_redelivery_after_a_failed_state_write_persists_the_epoch(self) -> None:
        event = _event(self.a)
        real_file, self.svc._state_file = (
            self.svc._state_file,
            "/nonexistent/dir/ks.json",
        )
        self.assertRaises(OSError, self.svc.revoke, event)
        self.assertEqual(1, self.svc.checker.epoch(self.a))  # effective at once
        self.svc._state_file = real_file
        self.assertTrue(self.svc.revoke(event)["duplicate"])
        self.assertEqual(1, self._service().checker.epoch(self.a))

    def test_event_from_an_unknown_key_is_rejected(self) -> None:
        rogue = RevocationEvent(str(uuid.uuid4()), self.a, "x", "y", "z")
        signed = rogue.sign(ed25519.Ed25519PrivateKey.generate()).to_dict()
        err = self.assertRaises(RequestError, self.svc.revoke, signed)
        self.assertEqual("event_signature", err.code)
        self.assertEqual(0, self.svc.checker.epoch(self.a))

    def test_malformed_event_is_rejected(self) -> None:
        self.assertRaises(MalformedError, self.svc.revoke, {"event": {}})

    def test_epochs_and_secrets_survive_a_restart(self) -> None:
        self.svc.put_secret("s", b"k")
        held = _token(self.a, "secret:s")
        self.svc.revoke(_event(self.a))
        again = self._service()
        err = self.assertRaises(RequestError, again.get_secret, "s", held, None)
        self.assertEqual("capability_old_epoch", err.code)
        self.assertEqual(b"k", again.get_secret("s", _token(self.b, "secret:s"), None))

    def test_unknown_secret_is_404_after_a_valid_capability(self) -> None:
        self.assertRaises(
            NotFoundError,
            self.svc.get_secret,
            "nope",
            _token(self.a, "secret:nope"),
            None,
        )

    def test_revocation_rekeys_every_group_of_the_node(self) -> None:
        members = {}
        for node in (self.a, self.b):
            welcome = self.svc.join("g", _token(node, "group:g", "j"), None)
            members[node] = LkhMember(welcome, self.signer.public_key())
        for raw in self.svc.rekey_messages("g", members[self.a].epoch):
            members[self.a].apply(RekeyMessage.from_bytes(raw))
        result = self.svc.revoke(_event(self.b))
        self.assertEqual(["g"], result["groups_rekeyed"])
        for raw in self.svc.rekey_messages("g", members[self.a].epoch):
            members[self.a].apply(RekeyMessage.from_bytes(raw))
        self.assertEqual(self.svc._groups["g"].group_key(), members[self.a].group_key())

    def test_joining_again_resyncs(self) -> None:
        first = self.svc.join("g", _token(self.a, "group:g", "j"), None)
        self.svc.join("g", _token(self.b, "group:g", "j"), None)
        again = self.svc.join("g", _token(self.a, "group:g", "j"), None)
        self.assertEqual(first.slot, again.slot)
        self.assertGreater(again.epoch, first.epoch)

    def test_filegroup_stored_before_projects_is_adopted_by_a_former_reader(
        self,
    ) -> None:
        legacy = self.svc.filegroup_state("fg", _token(self.a, "filegroup:fg"), None)
        self.svc.revoke(_event(str(uuid.uuid4())))  # a save, as an older release
        with open(self.state) as f:
            old = json.load(f)
        del old["filegroups"]["fg"]["name"]  # not written before projects
        with open(self.state, "w") as f:
            json.dump(old, f)
        upgraded = self._service()
        # a node of another project that never read it gets its own
        other = upgraded.filegroup_state(
            "fg", _token(self.b, "filegroup:fg", project="beta"), None
        )
        self.assertNotEqual(legacy.key(0), other.key(0))
        # a former reader's project adopts it: same keys, kept across restarts
        adopted = upgraded.filegroup_state(
            "fg", _token(self.a, "filegroup:fg", project="alpha"), None
        )
        self.assertEqual((legacy.key(0), "fg"), (adopted.key(0), adopted.group))
        restarted = self._service()
        self.assertEqual(["alpha/fg", "beta/fg"], sorted(restarted._filegroups))
        again = restarted.filegroup_state(
            "fg", _token(self.a, "filegroup:fg", project="alpha"), None
        )
        self.assertEqual(legacy.key(0), again.key(0))

    def test_filegroup_of_a_revoked_reader_moves_to_a_new_version(self) -> None:
        state = self.svc.filegroup_state("fg", _token(self.a, "filegroup:fg"), None)
        self.assertEqual(0, state.version)
        self.svc.revoke(_event(self.a))
        fresh = self.svc.filegroup_state("fg", _token(self.b, "filegroup:fg"), None)
        self.assertEqual(1, fresh.version)
        self.assertEqual(state.key(0), fresh.key(0))
        again = self._service()  # the seed and version are durable
        self.assertEqual(1, again._filegroups["fg"].version)

    def test_member_too_far_behind_is_told_to_resync(self) -> None:
        welcome = self.svc.join("g", _token(self.a, "group:g", "j"), None)
        for _ in range(1030):  # more changes than the service keeps
            node = str(uuid.uuid4())
            self.svc.join("g", _token(node, "group:g", "j"), None)
        err = self.assertRaises(
            RequestError, self.svc.rekey_messages, "g", welcome.epoch
        )
        self.assertEqual(("resync", 409), (err.code, err.status))
        again = self.svc.join("g", _token(self.a, "group:g", "j"), None)
        self.assertEqual(self.svc.group_epoch("g"), again.epoch)

    def test_join_needs_the_join_right(self) -> None:
        err = self.assertRaises(
            RequestError, self.svc.join, "g", _token(self.a, "group:g", "r"), None
        )
        self.assertEqual("capability_no_right", err.code)


class KeyServiceApiTest(testtools.TestCase):
    """The REST API without TLS (roles off), on aiohttp's test server."""

    def setUp(self) -> None:
        super().setUp()
        self.loop = asyncio.new_event_loop()
        self.addCleanup(self.loop.close)
        self.svc = KeyService(
            MAC_KEY,
            [EVENTS.public_key()],
            ed25519.Ed25519PrivateKey.generate(),
            clock=lambda: NOW,
        )
        self.client = TestClient(TestServer(make_app(self.svc, "PEM")), loop=self.loop)
        self.loop.run_until_complete(self.client.start_server())
        self.addCleanup(self.loop.run_until_complete, self.client.close())
        self.node = str(uuid.uuid4())

    def call(self, method: str, path: str, token: str | None = None, **kw):  # type: ignore[no-untyped-def]
        headers = {"Authorization": f"Capability {token}"} if token else {}

        async def go():  # type: ignore[no-untyped-def]
            r = await self.client.request(method, path, headers=headers, **kw)
            return r.status, await r.json() if r.status != 204 else None

        return self.loop.run_until_complete(go())

    def test_secret_round_trip_and_refusals_are_json(self) -> None:
        body = {"secret": base64.b64encode(b"luks").decode()}
        self.assertEqual(204, self.call("PUT", "/v1/secrets/v1", json=body)[0])
        status, data = self.call(
            "GET", "/v1/secrets/v1", _token(self.node, "secret:v1")
        )
        self.assertEqual((200, "bHVrcw=="), (status, data["secret"]))
        status, data = self.call("GET", "/v1/secrets/v1")
        self.assertEqual((401, "capability_missing"), (status, data["error"]["code"]))
        status, data = self.call("GET", "/v1/secrets/v1", "garbage")
        self.assertEqual((403, "capability_malformed"), (status, data["error"]["code"]))
        status, data = self.call("GET", "/v1/secrets/bad%20name", "x")
        self.assertEqual((400, "bad_name"), (status, data["error"]["code"]))

    def test_key_releases_are_counted_and_served_on_metrics(self) -> None:
        def count(result: str) -> float:
            labels = {"kind": "secret", "result": result}
            name = "trusted_cloud_key_releases_total"
            return metrics.REGISTRY.get_sample_value(name, labels) or 0.0

        released, refused = count("released"), count("refused")
        body = {"secret": base64.b64encode(b"luks").decode()}
        self.call("PUT", "/v1/secrets/v1", json=body)
        self.call("GET", "/v1/secrets/v1", _token(self.node, "secret:v1"))
        self.call("GET", "/v1/secrets/v1", "garbage")
        self.assertEqual(
            (released + 1, refused + 1), (count("released"), count("refused"))
        )

        async def scrape() -> tuple[int, str]:
            r = await self.client.get("/metrics")
            return r.status, await r.text()

        status, text = self.loop.run_until_complete(scrape())
        self.assertEqual(200, status)
        self.assertIn(
            'trusted_cloud_key_releases_total{kind="secret",result="released"}', text
        )

    def test_rekey_for_unknown_group_and_bad_since(self) -> None:
        status, data = self.call("GET", "/v1/groups/none/rekey")
        self.assertEqual((404, "unknown_group"), (status, data["error"]["code"]))
        status, data = self.call("GET", "/v1/groups/none/rekey?since=x")
        self.assertEqual((400, "bad_field"), (status, data["error"]["code"]))

    def test_revocation_endpoint_counts(self) -> None:
        status, data = self.call("POST", "/v1/revocations", json=_event(self.node))
        self.assertEqual((200, 1), (status, data["epoch"]))
        status, data = self.call("GET", "/v1/stats")
        self.assertEqual(1, data["revocations"])
