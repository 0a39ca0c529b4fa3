"""The policy store's runtime deltas (issue 28): a version stored as its
additions over a base of the same project, loaded composed with one shared
base object, a base kept while a delta extends it. Real SQLite database,
migrated as the verifier does."""

from __future__ import annotations

import hashlib
from typing import Any

import fixtures
import testtools
from cryptography.hazmat.primitives.asymmetric import ed25519

from node_agent.trial.ima import make_entry
from verifier.attest.policies import PolicyStore
from verifier.attest.quotas import Quotas
from verifier.db import make_engine, upgrade
from verifier.exceptions import ConflictError, NotFoundError, RequestError
from verifier.protocol.ima import RuntimePolicy, evaluate
from verifier.protocol.ima.policy import canonical_document

RUNTIME = "runtime"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


BASE = {
    "name": "web",
    "version": 4,
    "digests": {f"/usr/lib/f{i}": [sha(b"%d" % i)] for i in range(200)},
    "excludes": ["/tmp/"],
}


def delta(base_digest: str, version: int = 5, **fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "web",
        "version": version,
        "base": base_digest,
        "digests": {f"/opt/v{version}": [sha(b"v%d" % version)]},
    }
    doc.update(fields)
    return doc


class PolicyStoreDeltaTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        workdir = self.useFixture(fixtures.TempDir()).path
        self.engine = make_engine(f"sqlite:///{workdir}/verifier.db")
        self.addCleanup(self.engine.dispose)
        upgrade(self.engine)
        self.store = PolicyStore(self.engine)
        self.base, _ = self.store.add(RUNTIME, BASE, project="p1")

    def add_delta(self, version: int = 5, project: str = "p1") -> dict[str, Any]:
        meta, created = self.store.add(
            RUNTIME, delta(self.base["digest"], version), project=project
        )
        self.assertTrue(created)
        return meta

    def test_a_delta_is_stored_once_with_its_own_entries(self) -> None:
        meta = self.add_delta()
        self.assertEqual(1, meta["entries"])
        self.assertEqual(
            {"name": "web", "version": 4, "digest": self.base["digest"]},
            meta["base"],
        )
        self.assertEqual(
            (meta, False),
            self.store.add(RUNTIME, delta(self.base["digest"]), project="p1"),
        )
        self.assertEqual(2, len(self.store.list(RUNTIME, "p1")))

    def test_load_composes_a_delta_with_one_shared_base_object(self) -> None:
        d5, d6 = self.add_delta(5), self.add_delta(6)
        for store in (self.store, PolicyStore(self.engine)):  # cached, then cold
            five, six = store.load(d5["digest"]), store.load(d6["digest"])
            base = store.load(self.base["digest"])
            assert isinstance(five, RuntimePolicy) and isinstance(six, RuntimePolicy)
            assert isinstance(base, RuntimePolicy)
            self.assertIs(base, five.base)
            self.assertIs(base, six.base)
            self.assertIs(base._allow, five._allows[1])  # shared, not copied
            self.assertIs(five, store.load(d5["digest"]))
            self.assertEqual(d5["digest"], five.digest.hex())
            log = [make_entry("/usr/lib/f7", b"7"), make_entry("/opt/v5", b"v5")]
            self.assertEqual([], evaluate(five, log, 1))
            self.assertEqual(["/opt/v5"], [f.path for f in evaluate(six, log, 1)])

    def test_a_delta_over_a_delta(self) -> None:
        d5 = self.add_delta(5)
        d6, _ = self.store.add(RUNTIME, delta(d5["digest"], 6), project="p1")
        six = PolicyStore(self.engine).load(d6["digest"])
        assert isinstance(six, RuntimePolicy) and six.base is not None
        self.assertEqual(d5["digest"], six.base.digest.hex())
        log = [make_entry("/opt/v5", b"v5"), make_entry("/opt/v6", b"v6")]
        self.assertEqual([], evaluate(six, log, 1))
        self.assertRaises(ConflictError, self.store.delete, RUNTIME, "web@5", "p1")

    def test_get_returns_the_stored_document_and_names_the_base(self) -> None:
        d5 = self.add_delta()
        shown = self.store.get(RUNTIME, "web", "p1")  # the newest: the delta
        self.assertEqual(d5["digest"], shown["digest"])
        self.assertEqual(self.base["digest"], shown["policy"]["base"])
        self.assertEqual({"/opt/v5": [sha(b"v5")]}, shown["policy"]["digests"])
        self.assertEqual(
            {"name": "web", "version": 4, "digest": self.base["digest"]},
            shown["base"],
        )
        self.assertIsNone(self.store.get(RUNTIME, "web@4", "p1")["base"])
        listed = {m["version"]: m["base"] for m in self.store.list(RUNTIME, "p1")}
        self.assertEqual({4: None, 5: shown["base"]}, listed)

    def test_a_delta_over_a_missing_base_is_404_naming_it(self) -> None:
        missing = "ab" * 32
        exc = self.assertRaises(
            NotFoundError, self.store.add, RUNTIME, delta(missing), project="p1"
        )
        self.assertEqual("unknown_policy", exc.code)
        self.assertIn(missing, exc.detail)
        self.assertEqual(1, len(self.store.list(RUNTIME, "p1")))

    def test_a_delta_over_another_projects_base_is_404(self) -> None:
        exc = self.assertRaises(
            NotFoundError,
            self.store.add,
            RUNTIME,
            delta(self.base["digest"]),
            project="p2",
        )
        self.assertEqual("unknown_policy", exc.code)
        self.assertIn(self.base["digest"], exc.detail)
        self.assertEqual([], self.store.list(RUNTIME, "p2"))
        # once p2 stores the same base itself, its delta is accepted
        self.store.add(RUNTIME, BASE, project="p2")
        self.add_delta(project="p2")

    def test_deleting_a_base_a_delta_extends_is_409_naming_it(self) -> None:
        d5 = self.add_delta()
        self.store.add(RUNTIME, BASE, project="p2")  # p2's copy is not p1's
        exc = self.assertRaises(
            ConflictError, self.store.delete, RUNTIME, "web@4", "p1"
        )
        self.assertEqual("policy_in_use", exc.code)
        self.assertIn(d5["digest"], exc.detail)
        self.assertIn("version 5", exc.detail)
        self.store.delete(RUNTIME, "web@4", "p2")  # nothing extends it there
        self.assertEqual(2, len(self.store.list(RUNTIME, "p1")))
        self.store.delete(RUNTIME, "web@5", "p1")
        self.store.delete(RUNTIME, "web@4", "p1")
        self.assertEqual([], self.store.list(RUNTIME, "p1"))

    def test_a_bad_delta_is_400_and_stores_nothing(self) -> None:
        digest = self.base["digest"]
        for bad, why in (
            (delta(digest, name="db"), "differs from its base's"),
            (delta(digest, version=4), "not greater than its base's 4"),
            (delta(digest.upper()), "64 lowercase hex"),
            (delta(digest, digests={"/a": ["sha256:zz"]}), "not hex"),
        ):
            exc = self.assertRaises(
                RequestError, self.store.add, RUNTIME, bad, project="p1"
            )
            self.assertEqual("bad_policy", exc.code)
            self.assertIn(why, exc.detail)
        self.assertEqual(1, len(self.store.list(RUNTIME, "p1")))

    def test_entries_of_the_base_count_against_the_limit(self) -> None:
        small = PolicyStore(self.engine, max_entries=201)  # the base has 201
        exc = self.assertRaises(
            RequestError,
            small.add,
            RUNTIME,
            delta(self.base["digest"]),
            project="p1",
        )
        self.assertIn("(and 201 in its base)", exc.detail)

    def test_quotas_count_the_delta_bytes_only(self) -> None:
        body = canonical_document(delta(self.base["digest"]))
        base_bytes = len(canonical_document(BASE))
        self.assertGreater(base_bytes, 10 * len(body))
        store = PolicyStore(
            self.engine, quotas=Quotas(policy_bytes=base_bytes + len(body))
        )
        store.add(RUNTIME, delta(self.base["digest"]), project="p1")
        self.assertRaises(
            RequestError,
            store.add,
            RUNTIME,
            delta(self.base["digest"], 6),
            project="p1",
        )

    def test_a_signature_covers_the_base_reference(self) -> None:
        key = ed25519.Ed25519PrivateKey.generate()
        store = PolicyStore(self.engine, signing_keys=[key.public_key()])
        doc = delta(self.base["digest"])
        without = canonical_document({k: v for k, v in doc.items() if k != "base"})
        exc = self.assertRaises(
            RequestError,
            store.add,
            RUNTIME,
            doc,
            signature=key.sign(without),
            project="p1",
        )
        self.assertEqual("policy_signature", exc.code)
        meta, _ = store.add(
            RUNTIME,
            doc,
            signature=key.sign(canonical_document(doc)),
            project="p1",
        )
        self.assertTrue(meta["signed"])
