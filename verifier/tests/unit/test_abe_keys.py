"""The verifier's CP-ABE authority and the node's keyring (no network)."""

from __future__ import annotations

import json
import os
import stat
import uuid as uuid_mod

import fixtures
import testtools

from node_agent.abe import AbeKeyring
from node_agent.agent import Agent
from node_agent.exceptions import RefusedError
from trusted_testing.softtpm import SoftTpm
from verifier.attest.abe_keys import AbeAuthority, ProviderAttributes, load_master_key
from verifier.common.tpm_access import TpmAccess
from verifier.exceptions import ConfigError
from verifier.protocol import EnvelopeError, MalformedError, seal_share
from verifier.protocol.abe import (
    AbeError,
    SealIntegrityError,
    SecretKey,
    keygen,
    seal,
    setup,
    unseal,
)

DIGEST = bytes(range(32))
ALPHA, BETA = "4f1c0d9e8b7a6c5d4e3f2a1b0c9d8e7f", "0a1b2c3d4e5f60718293a4b5c6d7e8f9"


class MasterKeyFileTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.path = os.path.join(self.dir, "abe", "master.key")

    def test_created_0600_and_reloaded_unchanged(self) -> None:
        pp, msk, epoch = load_master_key(self.path)
        self.assertEqual(0o600, stat.S_IMODE(os.stat(self.path).st_mode))
        again = load_master_key(self.path)
        self.assertEqual(
            (pp.id, msk.to_bytes(), epoch), (again[0].id, again[1].to_bytes(), 0)
        )

    def test_group_readable_file_is_refused(self) -> None:
        load_master_key(self.path)
        os.chmod(self.path, 0o640)
        exc = self.assertRaises(ConfigError, load_master_key, self.path)
        self.assertIn("chmod 600", str(exc))

    def test_garbage_and_mismatched_files_are_refused(self) -> None:
        load_master_key(self.path)
        with open(self.path, encoding="utf-8") as f:
            data = json.load(f)
        data["public_params"] = data["public_params"][:-8] + "AAAAAAA="
        for body in ("not json", json.dumps(data)):
            with open(self.path, "w", encoding="utf-8") as f:
                f.write(body)
            self.assertRaises(ConfigError, load_master_key, self.path)


class ProviderAttributesTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.path = os.path.join(self.useFixture(fixtures.TempDir()).path, "p.json")
        self.uuid = str(uuid_mod.uuid4())

    def write(self, table: object) -> ProviderAttributes:
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump(table, f)
        return ProviderAttributes(self.path)

    def test_known_node_gets_its_attributes_and_others_none(self) -> None:
        p = self.write({self.uuid: {"region": "eu-west", "hv": "kvm-9.2"}})
        self.assertEqual(frozenset({"region=eu-west", "hv=kvm-9.2"}), p.get(self.uuid))
        self.assertIsNone(p.get(str(uuid_mod.uuid4())))
        self.assertIsNone(ProviderAttributes(None).get(self.uuid))

    def test_change_is_picked_up(self) -> None:
        p = self.write({self.uuid: {"region": "eu"}})
        self.assertEqual(frozenset({"region=eu"}), p.get(self.uuid))
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump({self.uuid: {"region": "us-east"}}, f)
        self.assertEqual(frozenset({"region=us-east"}), p.get(self.uuid))

    def test_reserved_and_unencodable_attributes_are_refused(self) -> None:
        bad_tables = (
            {"pcrs": "00"},
            {"epoch": "9"},
            {"project": ALPHA},
            {"region": "eu west"},
            {"r": 1},
        )
        for bad in bad_tables:
            p = self.write({self.uuid: bad})
            exc = self.assertRaises(ConfigError, p.get, self.uuid)
            self.assertIn(self.uuid, str(exc))
        self.assertRaises(ConfigError, self.write(["x"]).get, self.uuid)


class AuthorityTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.uuids = [str(uuid_mod.uuid4()) for _ in range(3)]
        table = {
            self.uuids[0]: {"region": "eu", "hv": "kvm-9"},
            self.uuids[1]: {"region": "eu", "hv": "kvm-9"},
            self.uuids[2]: {"region": "us", "hv": "kvm-9"},
        }
        attrs = os.path.join(self.dir, "attrs.json")
        with open(attrs, "w", encoding="utf-8") as f:
            json.dump(table, f)
        self.key_file = os.path.join(self.dir, "master.key")
        self.authority = AbeAuthority(
            self.key_file,
            ProviderAttributes(attrs),
            agents=None,  # type: ignore[arg-type]
        )

    def test_attributes_are_provider_known_plus_attested_state(self) -> None:
        self.assertEqual(
            frozenset(
                {
                    "region=eu",
                    "hv=kvm-9",
                    f"pcrs={DIGEST.hex()}",
                    "epoch=0",
                    f"project={ALPHA}",
                }
            ),
            self.authority.attributes(self.uuids[0], DIGEST, ALPHA),
        )
        unknown = str(uuid_mod.uuid4())
        self.assertIsNone(self.authority.attributes(unknown, DIGEST, ALPHA))

    def test_node_without_a_project_gets_no_key(self) -> None:
        self.assertIsNone(self.authority.attributes(self.uuids[0], DIGEST, ""))

    def test_project_that_is_no_attribute_value_is_refused(self) -> None:
        self.assertRaises(
            ConfigError, self.authority.attributes, self.uuids[0], DIGEST, "a b"
        )

    def test_identical_configurations_share_one_key(self) -> None:
        keys = [
            self.authority.key_for(self.authority.attributes(u, DIGEST, ALPHA))  # type: ignore[arg-type]
            for u in self.uuids
        ]
        self.assertEqual(keys[0], keys[1])
        self.assertNotEqual(keys[0], keys[2])
        self.assertEqual(2, self.authority.keygens)

    def test_identical_configurations_of_two_projects_do_not_share_a_key(
        self,
    ) -> None:
        alpha = self.authority.attributes(self.uuids[0], DIGEST, ALPHA)
        beta = self.authority.attributes(self.uuids[1], DIGEST, BETA)
        assert alpha is not None and beta is not None
        self.assertNotEqual(self.authority.key_for(alpha), self.authority.key_for(beta))
        blob = seal(self.authority.pp, f"region=eu and project={ALPHA}", b"alpha")
        self.assertEqual(b"alpha", unseal(self.authority.pp, self.sk(alpha), blob))
        self.assertRaises(AbeError, unseal, self.authority.pp, self.sk(beta), blob)

    def sk(self, attrs: frozenset[str]) -> SecretKey:
        return SecretKey.from_bytes(self.authority.key_for(attrs))

    def test_revocation_starts_a_persisted_epoch_with_fresh_keys(self) -> None:
        attrs = self.authority.attributes(self.uuids[0], DIGEST, ALPHA)
        assert attrs is not None
        old = self.authority.key_for(attrs)
        self.authority.revoked(self.uuids[2])
        self.assertEqual(1, self.authority.epoch)
        self.assertEqual(1, load_master_key(self.key_file)[2])
        new_attrs = self.authority.attributes(self.uuids[0], DIGEST, ALPHA)
        assert new_attrs is not None
        self.assertIn("epoch=1", new_attrs)
        self.assertNotEqual(old, self.authority.key_for(new_attrs))
        self.assertEqual(1, self.authority.params().epoch)
        self.assertEqual(ALPHA, self.authority.params(ALPHA).project)


class KeyringTest(testtools.TestCase):
    """The node's side, with a real Agent (its NK) and no TPM calls."""

    def setUp(self) -> None:
        super().setUp()
        work = self.useFixture(fixtures.TempDir()).path
        self.agent = Agent(str(uuid_mod.uuid4()), TpmAccess(SoftTpm), work)
        self.keyring = AbeKeyring(self.agent)
        self.pp, self.msk = setup()

    def give(self, attrs: list[str], epoch: int = 0) -> None:
        sk = keygen(self.msk, attrs).to_bytes()
        envelope = seal_share(self.agent.nk_public, sk, "ABE", self.agent.uuid)
        self.keyring.receive(envelope, self.pp.to_bytes(), epoch)

    def test_opens_with_a_satisfying_key_and_keeps_old_epochs(self) -> None:
        self.give(["region=eu", "epoch=0"], 0)
        self.give(["region=eu", "epoch=1"], 1)
        self.assertEqual([0, 1], [k["epoch"] for k in self.keyring.describe()["keys"]])
        for epoch in (0, 1):
            blob = seal(self.pp, f"region=eu and epoch={epoch}", b"data")
            self.assertEqual(b"data", self.keyring.open(blob))

    def test_no_key_and_unsatisfied_policy_are_refused(self) -> None:
        blob = seal(self.pp, "region=eu", b"data")
        exc = self.assertRaises(RefusedError, self.keyring.open, blob)
        self.assertEqual("no_abe_key", exc.code)
        self.give(["region=us"])
        exc = self.assertRaises(RefusedError, self.keyring.open, blob)
        self.assertEqual(("policy_not_satisfied", 403), (exc.code, exc.status))

    def test_key_sealed_to_another_node_is_refused(self) -> None:
        other = Agent(str(uuid_mod.uuid4()), TpmAccess(SoftTpm), self.agent.work_dir)
        sk = keygen(self.msk, ["region=eu"]).to_bytes()
        envelope = seal_share(other.nk_public, sk, "ABE", other.uuid)
        self.assertRaises(
            EnvelopeError, self.keyring.receive, envelope, self.pp.to_bytes(), 0
        )

    def test_key_for_other_parameters_is_refused(self) -> None:
        other_pp, _ = setup()
        sk = keygen(self.msk, ["region=eu"]).to_bytes()
        envelope = seal_share(self.agent.nk_public, sk, "ABE", self.agent.uuid)
        exc = self.assertRaises(
            RefusedError, self.keyring.receive, envelope, other_pp.to_bytes(), 0
        )
        self.assertEqual("abe_key_mismatch", exc.code)

    def test_tampered_and_truncated_blobs_are_refused(self) -> None:
        self.give(["region=eu"])
        blob = bytearray(seal(self.pp, "region=eu", b"data"))
        blob[-1] ^= 1
        self.assertRaises(SealIntegrityError, self.keyring.open, bytes(blob))
        self.assertRaises(MalformedError, self.keyring.open, bytes(blob[:40]))

    def test_blob_for_other_parameters_is_refused(self) -> None:
        self.give(["region=eu"])
        other_pp, _ = setup()
        exc = self.assertRaises(
            RefusedError, self.keyring.open, seal(other_pp, "region=eu", b"x")
        )
        self.assertEqual("other_params", exc.code)
