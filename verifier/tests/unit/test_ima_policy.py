"""IMA runtime policies: parsing, evaluation, signatures, generation."""

import base64
import hashlib
import struct

import testtools
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import Prehashed

from node_agent.trial.ima import boot_aggregate_entry, make_entry
from verifier.protocol import EvidenceError, MalformedError
from verifier.protocol.ima import (
    ImaKey,
    RuntimePolicy,
    check,
    evaluate,
    policy_from_files,
    policy_from_log,
    sign,
    verify,
    verify_ima_signature,
)
from verifier.protocol.ima.policy import DEFAULT_MAX_ENTRIES

PCRS = [bytes(32)] * 10
SHA256_A = hashlib.sha256(b"a").digest()
SHA1_A = hashlib.sha1(b"a").digest()


def ima_sig(key: ImaKey, private: object, digest: bytes, algo_id: int = 4) -> bytes:
    """An IMA signature v2 (evmctl sign --hashalgo sha256)."""
    prehashed = Prehashed(hashes.SHA256())
    if isinstance(private, rsa.RSAPrivateKey):
        body = private.sign(digest, padding.PKCS1v15(), prehashed)
    else:
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        body = private.sign(digest, ec.ECDSA(prehashed))
    return bytes([3, 2, algo_id]) + key.keyid + struct.pack(">H", len(body)) + body


def base_policy(**kwargs: object) -> RuntimePolicy:
    data = {
        "name": "web",
        "version": 3,
        "digests": {
            "/usr/bin/a": [f"sha256:{SHA256_A.hex()}", f"sha1:{SHA1_A.hex()}"],
            "/usr/bin/b": [f"sha256:{hashlib.sha256(b'b').hexdigest()}"],
        },
        "excludes": ["/tmp/", r"/var/log/.*\.log$"],
        "ima_buf": {"kexec-cmdline": [f"sha256:{hashlib.sha256(b'ro').hexdigest()}"]},
    }
    data.update(kwargs)
    return RuntimePolicy.from_dict(data)


class PolicyParseTest(testtools.TestCase):
    def test_round_trip_and_content_identity(self) -> None:
        policy = base_policy()
        again = RuntimePolicy.from_dict(policy.to_dict())
        self.assertEqual(policy, again)
        self.assertEqual(hash(policy), hash(again))
        self.assertEqual(1, len({policy, again}))
        self.assertEqual(("web", 3), (policy.name, policy.version))
        self.assertEqual(
            frozenset({("sha256", SHA256_A), ("sha1", SHA1_A)}),
            policy.allowed("/usr/bin/a"),
        )
        self.assertNotEqual(policy, base_policy(version=4))
        self.assertRaises(AttributeError, setattr, policy, "version", 9)

    def test_constructor_equals_json(self) -> None:
        policy = RuntimePolicy("p", 1, {"/a": [("sha256", SHA256_A)]}, ["/tmp/"])
        self.assertEqual(policy, RuntimePolicy.from_dict(policy.to_dict()))

    def test_invalid_regex_names_the_pattern(self) -> None:
        exc = self.assertRaises(MalformedError, base_policy, excludes=["/ok", "/bad[("])
        self.assertIn("'/bad[('", exc.detail)

    def test_same_group_name_in_two_excludes(self) -> None:
        policy = base_policy(excludes=["/(?P<x>a)", "/(?P<x>b)"])
        self.assertTrue(policy.is_excluded("/b"))
        self.assertFalse(policy.is_excluded("/c"))

    def test_malformed(self) -> None:
        for bad in (
            {"digests": {"/a": ["sha256:zz"]}},
            {"digests": {"/a": ["sha256:" + "aa" * 20]}},
            {"digests": {"/a": ["md4:" + "aa" * 16]}},
            {"digests": {"/a": []}},
            {"digests": {"/a": "sha256:" + "aa" * 32}},
            {"digests": []},
            {"excludes": [3]},
            {"keys": [{"public_key": "!!"}]},
            {"name": ""},
            {"version": -1},
            {"version": "1"},
            {"extra": 1},
        ):
            self.assertRaises(MalformedError, base_policy, **bad)
        self.assertRaises(MalformedError, RuntimePolicy.from_dict, [])

    def test_max_entries(self) -> None:
        self.assertEqual(5_000_000, DEFAULT_MAX_ENTRIES)
        data = base_policy().to_dict()
        RuntimePolicy.from_dict(data, max_entries=6)
        exc = self.assertRaises(
            MalformedError, RuntimePolicy.from_dict, data, max_entries=5
        )
        self.assertIn("limit", exc.detail)


class EvaluateTest(testtools.TestCase):
    def log(self, *entries: object) -> list:  # type: ignore[type-arg]
        return [boot_aggregate_entry(PCRS), *entries]

    def test_allowed(self) -> None:
        log = self.log(
            make_entry("/usr/bin/a", b"a"),
            make_entry("/usr/bin/a", b"a", algorithm="sha1"),
            make_entry("/usr/bin/a", b"a", template="ima"),
            make_entry("/usr/bin/b", b"b", template="ima-sig"),
            make_entry("kexec-cmdline", template="ima-buf", buffer=b"ro"),
        )
        self.assertEqual([], evaluate(base_policy(), log))
        check(base_policy(), log)

    def test_unknown_file_and_wrong_digest(self) -> None:
        log = self.log(make_entry("/usr/bin/c", b"c"), make_entry("/usr/bin/a", b"x"))
        failures = evaluate(base_policy(), log)
        self.assertEqual(
            [(1, "/usr/bin/c", "unknown_file"), (2, "/usr/bin/a", "digest_mismatch")],
            [(f.index, f.path, f.reason) for f in failures],
        )
        exc = self.assertRaises(EvidenceError, check, base_policy(), log)
        self.assertEqual("ima_policy", exc.reason)
        self.assertIn("entry 1 '/usr/bin/c': unknown_file", exc.detail)
        self.assertIn("1 more", exc.detail)

    def test_first_index(self) -> None:
        failures = evaluate(base_policy(), [make_entry("/x", b"x")], first_index=41)
        self.assertEqual(41, failures[0].index)
        # boot_aggregate is only skipped as entry 0.
        failures = evaluate(base_policy(), [boot_aggregate_entry(PCRS)], 5)
        self.assertEqual("unknown_file", failures[0].reason)

    def test_excluded(self) -> None:
        log = self.log(
            make_entry("/tmp/x", b"x"),
            make_entry("/var/log/app.log", b"y"),
            make_entry("/tmp/v", violation=True),
        )
        self.assertEqual([], evaluate(base_policy(), log))
        failures = evaluate(
            base_policy(), self.log(make_entry("/var/log/app.txt", b"y"))
        )
        self.assertEqual("unknown_file", failures[0].reason)

    def test_violation(self) -> None:
        failures = evaluate(
            base_policy(), self.log(make_entry("/etc/x", violation=True))
        )
        self.assertEqual("violation", failures[0].reason)

    def test_ima_buf(self) -> None:
        failures = evaluate(
            base_policy(),
            self.log(
                make_entry("kexec-cmdline", template="ima-buf", buffer=b"rw"),
                make_entry("other", template="ima-buf", buffer=b"ro"),
                make_entry(
                    "kexec-cmdline", template="ima-buf", buffer=b"ro", digest=bytes(32)
                ),
            ),
        )
        self.assertEqual(
            ["buffer_not_allowed", "buffer_not_allowed", "buffer_digest_mismatch"],
            [f.reason for f in failures],
        )


class ImaSignatureTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.ec_priv = ec.generate_private_key(ec.SECP256R1())
        self.ec_key = ImaKey.from_public_key(self.ec_priv.public_key())
        self.rsa_priv = rsa.generate_private_key(65537, 2048)
        self.rsa_key = ImaKey.from_public_key(self.rsa_priv.public_key())
        self.policy = base_policy(keys=[self.ec_key.to_dict(), self.rsa_key.to_dict()])

    def test_signed_files_are_allowed(self) -> None:
        digest = hashlib.sha256(b"signed").digest()
        for key, priv in ((self.ec_key, self.ec_priv), (self.rsa_key, self.rsa_priv)):
            sig = ima_sig(key, priv, digest)
            self.assertTrue(verify_ima_signature(sig, "sha256", digest, [key]))
            entry = make_entry("/opt/app", b"signed", template="ima-sig", signature=sig)
            self.assertEqual([], evaluate(self.policy, [entry], 1))

    def test_bad_signatures(self) -> None:
        digest = hashlib.sha256(b"signed").digest()
        good = ima_sig(self.ec_key, self.ec_priv, digest)
        other = ec.generate_private_key(ec.SECP256R1())
        bad = [
            ima_sig(self.ec_key, other, digest),  # right key id, wrong key
            good[:-1],  # size mismatch
            b"\x03\x03" + good[2:],  # version 3
            good[:2] + b"\x02" + good[3:],  # claims sha1
            good[:3] + b"\x00\x00\x00\x00" + good[7:],  # unknown key id
        ]
        for sig in bad:
            self.assertFalse(verify_ima_signature(sig, "sha256", digest, [self.ec_key]))
            entry = make_entry("/opt/app", b"signed", template="ima-sig", signature=sig)
            failures = evaluate(self.policy, [entry], 1)
            self.assertEqual("bad_signature", failures[0].reason)
        # A wrong digest with a signature over another file.
        entry = make_entry("/opt/app", b"evil", template="ima-sig", signature=good)
        self.assertEqual("bad_signature", evaluate(self.policy, [entry], 1)[0].reason)

    def test_key_round_trip_and_keyid(self) -> None:
        key = ImaKey.from_dict(self.rsa_key.to_dict())
        self.assertEqual(self.rsa_key.keyid, key.keyid)
        self.assertEqual(4, len(key.keyid))
        explicit = ImaKey.from_dict({**self.rsa_key.to_dict(), "keyid": "01020304"})
        self.assertEqual(b"\x01\x02\x03\x04", explicit.keyid)
        ed = ed25519.Ed25519PrivateKey.generate().public_key()

        der = ed.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.assertRaises(
            MalformedError,
            ImaKey.from_dict,
            {"public_key": base64.b64encode(der).decode()},
        )


class PolicySignatureTest(testtools.TestCase):
    def test_sign_verify_tamper(self) -> None:
        policy = base_policy()
        for priv in (
            ed25519.Ed25519PrivateKey.generate(),
            ec.generate_private_key(ec.SECP256R1()),
        ):
            sig = sign(policy, priv)
            verify(policy, sig, priv.public_key())
            verify(RuntimePolicy.from_dict(policy.to_dict()), sig, priv.public_key())
            tampered = base_policy(excludes=["/"])
            exc = self.assertRaises(
                EvidenceError, verify, tampered, sig, priv.public_key()
            )
            self.assertEqual("ima_policy_signature", exc.reason)
            self.assertRaises(
                EvidenceError, verify, policy, bytes(64), priv.public_key()
            )


class GenerateTest(testtools.TestCase):
    def test_from_log(self) -> None:
        log = [
            boot_aggregate_entry(PCRS),
            make_entry("/usr/bin/a", b"a"),
            make_entry("/usr/bin/a", b"a2"),
            make_entry("/tmp/v", violation=True),
            make_entry("kexec-cmdline", template="ima-buf", buffer=b"ro"),
        ]
        policy = policy_from_log(log, "golden", 1)
        self.assertEqual(["/usr/bin/a"], list(policy.to_dict()["digests"]))
        self.assertEqual(2, len(policy.allowed("/usr/bin/a")))
        self.assertEqual([], evaluate(policy, log[:3] + log[4:]))

    def test_from_files(self) -> None:
        policy = policy_from_files(
            [("/bin/a", b"a")], "tree", 2, algorithms=("sha256", "sha1")
        )
        self.assertEqual(
            frozenset({("sha256", SHA256_A), ("sha1", SHA1_A)}),
            policy.allowed("/bin/a"),
        )
        entries = [make_entry("/bin/a", b"a", algorithm="sha1")]
        self.assertEqual([], evaluate(policy, entries, 1))
