"""Runtime policy deltas (issue 28): a version stored as additions over a
base, composed with the base's tables shared, judging exactly like the full
policy of the union; one named test per malformed delta."""

from __future__ import annotations

import hashlib
import json
import random
import struct
from typing import Any

import testtools
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.utils import Prehashed

from node_agent.trial.ima import boot_aggregate_entry, make_entry
from verifier.protocol import EvidenceError, MalformedError
from verifier.protocol.ima import (
    ImaEntry,
    ImaKey,
    RuntimePolicy,
    evaluate,
    sign,
    verify,
)
from verifier.protocol.ima.policy import (
    MAX_DELTA_DEPTH,
    base_digest,
    canonical_document,
)

PCRS = [bytes(32)] * 10


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


BASE_DOC: dict[str, Any] = {
    "name": "web",
    "version": 4,
    "digests": {
        "/usr/bin/a": [sha(b"a")],
        "/usr/bin/b": [sha(b"b"), sha(b"b-old")],
    },
    "excludes": ["/tmp/"],
    "ima_buf": {"kexec-cmdline": [sha(b"ro")]},
}


def full(doc: dict[str, Any] | None = None) -> RuntimePolicy:
    return RuntimePolicy.from_dict(doc or BASE_DOC)


def delta_doc(base: RuntimePolicy, **fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": base.name,
        "version": base.version + 1,
        "base": base.digest.hex(),
        "digests": {"/usr/bin/a": [sha(b"a2")], "/usr/bin/c": [sha(b"c")]},
    }
    doc.update(fields)
    return doc


def names(failures: list[Any]) -> list[tuple[str, str]]:
    return [(f.path, f.reason) for f in failures]


class DeltaCompositionTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.base = full()
        self.delta = RuntimePolicy.from_dict(delta_doc(self.base), base=self.base)

    def judge(self, policy: RuntimePolicy, *entries: ImaEntry) -> list[Any]:
        return names(evaluate(policy, [boot_aggregate_entry(PCRS), *entries]))

    def test_a_delta_adds_paths_and_digests_per_path(self) -> None:
        for entry in (
            make_entry("/usr/bin/a", b"a"),  # the base's digest
            make_entry("/usr/bin/a", b"a2"),  # the delta's, same path
            make_entry("/usr/bin/b", b"b-old"),  # the base's second one
            make_entry("/usr/bin/c", b"c"),  # a path only the delta has
        ):
            self.assertEqual([], self.judge(self.delta, entry))
        self.assertEqual(
            frozenset(
                {
                    ("sha256", hashlib.sha256(b"a").digest()),
                    ("sha256", hashlib.sha256(b"a2").digest()),
                }
            ),
            self.delta.allowed("/usr/bin/a"),
        )
        # the base alone still refuses what the delta adds
        self.assertEqual(
            [("/usr/bin/c", "unknown_file")],
            self.judge(self.base, make_entry("/usr/bin/c", b"c")),
        )

    def test_a_delta_cannot_remove_what_its_base_allows(self) -> None:
        # a delta listing /usr/bin/b with another digest only adds that one
        delta = RuntimePolicy.from_dict(
            delta_doc(self.base, digests={"/usr/bin/b": [sha(b"b-new")]}),
            base=self.base,
        )
        self.assertEqual([], self.judge(delta, make_entry("/usr/bin/b", b"b-old")))
        self.assertEqual([], self.judge(delta, make_entry("/usr/bin/b", b"b-new")))

    def test_what_neither_allows_is_refused_with_the_right_reason(self) -> None:
        self.assertEqual(
            [("/usr/bin/a", "digest_mismatch"), ("/usr/bin/z", "unknown_file")],
            self.judge(
                self.delta,
                make_entry("/usr/bin/a", b"evil"),
                make_entry("/usr/bin/z", b"z"),
            ),
        )

    def test_excludes_keys_and_buffers_of_both_apply(self) -> None:
        priv = ec.generate_private_key(ec.SECP256R1())
        key = ImaKey.from_public_key(priv.public_key())
        delta = RuntimePolicy.from_dict(
            delta_doc(
                self.base,
                excludes=["/var/cache/"],
                keys=[key.to_dict()],
                ima_buf={"kexec-cmdline": [sha(b"ro quiet")]},
            ),
            base=self.base,
        )
        digest = hashlib.sha256(b"signed").digest()
        body = priv.sign(digest, ec.ECDSA(Prehashed(hashes.SHA256())))
        sig = bytes([3, 2, 4]) + key.keyid + struct.pack(">H", len(body)) + body
        entries = (
            make_entry("/tmp/x", b"x"),  # the base's exclude
            make_entry("/var/cache/y", b"y"),  # the delta's
            make_entry("/opt/app", b"signed", template="ima-sig", signature=sig),
            make_entry("kexec-cmdline", template="ima-buf", buffer=b"ro"),
            make_entry("kexec-cmdline", template="ima-buf", buffer=b"ro quiet"),
        )
        self.assertEqual([], self.judge(delta, *entries))
        self.assertEqual(("/tmp/", "/var/cache/"), delta.excludes)
        self.assertEqual((key,), delta.keys)
        self.assertEqual(
            [("/var/cache/y", "unknown_file"), ("/opt/app", "unknown_file")],
            self.judge(self.base, *entries[1:3]),
        )

    def test_composed_judges_like_the_full_policy_of_the_union(self) -> None:
        rng = random.Random(28)
        paths = [f"/usr/lib/f{i}" for i in range(200)]
        contents = [b"x%d" % i for i in range(6)]
        base_digests: dict[str, list[str]] = {}
        for p in paths[:150]:
            base_digests[p] = sorted({sha(rng.choice(contents)) for _ in range(2)})
        base = full({"name": "u", "version": 1, "digests": base_digests})
        policy, union = base, {k: set(v) for k, v in base_digests.items()}
        for version in (2, 3, 4):  # a chain of three deltas
            own = {
                p: sorted({sha(rng.choice(contents))}) for p in rng.sample(paths, 40)
            }
            doc = {"name": "u", "version": version, "digests": own}
            doc["base"] = policy.digest.hex()
            policy = RuntimePolicy.from_dict(doc, base=policy)
            for p, v in own.items():
                union.setdefault(p, set()).update(v)
        flat = full(
            {
                "name": "u",
                "version": 9,
                "digests": {p: sorted(v) for p, v in union.items()},
            }
        )
        log = [boot_aggregate_entry(PCRS)] + [
            make_entry(rng.choice(paths + ["/nowhere"]), rng.choice(contents))
            for _ in range(2000)
        ]
        expected = evaluate(flat, log)
        self.assertTrue(expected)  # some pass, some fail: the test can fail
        self.assertLess(len(expected), len(log) - 1)
        self.assertEqual(expected, evaluate(policy, log))
        self.assertEqual(len(flat), len(policy))

    def test_the_composed_policy_shares_its_base_tables(self) -> None:
        self.assertIs(self.base, self.delta.base)
        self.assertIs(self.base._allow, self.delta._allows[1])
        self.assertIs(self.base._buf, self.delta._bufs[1])
        self.assertEqual(2, len(self.delta._allow))  # its own small table only
        self.assertEqual(2, self.delta.own_paths)
        self.assertEqual(3, len(self.delta))  # a, b, c

    def test_digest_and_signature_cover_the_base_reference(self) -> None:
        doc = delta_doc(self.base)
        self.assertEqual(self.delta.to_dict()["base"], self.base.digest.hex())
        body = self.delta.canonical_json()
        self.assertEqual(hashlib.sha256(body).digest(), self.delta.digest)
        self.assertIn(b'"base":"' + self.base.digest.hex().encode(), body)
        # the document alone gives the same canonical form (for signing)
        self.assertEqual(body, canonical_document(json.loads(json.dumps(doc))))
        self.assertEqual(self.base.canonical_json(), canonical_document(BASE_DOC))
        key = ed25519.Ed25519PrivateKey.generate()
        signature = sign(self.delta, key)
        verify(self.delta, signature, key.public_key())
        # the same additions over another base: another document
        other = full({**BASE_DOC, "version": 3})
        moved = RuntimePolicy.from_dict(
            {**doc, "version": 5, "base": other.digest.hex()}, base=other
        )
        moved_doc = {**doc, "version": 5, "base": other.digest.hex()}
        self.assertNotEqual(canonical_document(moved_doc), body)
        self.assertRaises(EvidenceError, verify, moved, signature, key.public_key())

    def test_a_chain_of_deltas_up_to_the_limit(self) -> None:
        policy = self.base
        for i in range(MAX_DELTA_DEPTH):
            doc = delta_doc(policy, digests={f"/opt/v{i}": [sha(b"%d" % i)]})
            policy = RuntimePolicy.from_dict(doc, base=policy)
        self.assertEqual([], self.judge(policy, make_entry("/opt/v0", b"0")))
        self.assertEqual([], self.judge(policy, make_entry("/usr/bin/a", b"a")))
        exc = self.assertRaises(
            MalformedError, RuntimePolicy.from_dict, delta_doc(policy), base=policy
        )
        self.assertIn(f"more than {MAX_DELTA_DEPTH} deltas", exc.detail)


class MalformedDeltaTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.base = full()

    def refused(self, doc: Any, base: RuntimePolicy | None = None) -> str:
        exc = self.assertRaises(
            MalformedError,
            RuntimePolicy.from_dict,
            doc,
            base=self.base if base is None else base,
        )
        return str(exc.detail)

    def test_a_delta_of_another_name_is_refused(self) -> None:
        detail = self.refused(delta_doc(self.base, name="db"))
        self.assertIn("'db' differs from its base's 'web'", detail)

    def test_a_delta_whose_version_is_not_above_its_base_is_refused(self) -> None:
        for version in (4, 3, 0):
            detail = self.refused(delta_doc(self.base, version=version))
            self.assertIn("not greater than its base's 4", detail)

    def test_a_delta_over_another_base_is_refused(self) -> None:
        other = full({**BASE_DOC, "version": 2})
        detail = self.refused(delta_doc(other, version=5))
        self.assertIn("is not the given base", detail)

    def test_a_malformed_base_reference_is_refused(self) -> None:
        good = self.base.digest.hex()
        for bad in (good.upper(), good[:-1], good + "0", "", 7, None, ["x"]):
            doc = {**delta_doc(self.base), "base": bad}
            self.refused(doc)
            self.assertRaises(MalformedError, base_digest, doc)
            self.assertRaises(MalformedError, canonical_document, doc)

    def test_a_delta_without_its_base_object_is_refused(self) -> None:
        exc = self.assertRaises(
            MalformedError, RuntimePolicy.from_dict, delta_doc(self.base)
        )
        self.assertIn("needs its base policy", exc.detail)

    def test_a_full_policy_given_a_base_is_refused(self) -> None:
        detail = self.refused({**BASE_DOC, "version": 5})
        self.assertIn("names no base", detail)

    def test_entries_over_the_limit_counting_the_base_are_refused(self) -> None:
        # the base: 3 digests of 2 paths, 1 exclude, 1 buffer digest = 5
        RuntimePolicy.from_dict(BASE_DOC, max_entries=5)
        doc = delta_doc(self.base)  # 2 more
        RuntimePolicy.from_dict(doc, max_entries=7, base=self.base)
        exc = self.assertRaises(
            MalformedError,
            RuntimePolicy.from_dict,
            doc,
            max_entries=6,
            base=self.base,
        )
        self.assertIn("2 entries (and 5 in its base)", exc.detail)
        # the delta's own content is checked like any policy's
        self.refused(delta_doc(self.base, digests={"/a": ["sha256:zz"]}))
        self.refused(delta_doc(self.base, extra=1))
