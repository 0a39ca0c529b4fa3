"""Batched deep quotes (verifier.protocol.hostbatch): one test per attack,
the good paths over batch sizes and every index, and the parsers' total
behaviour on arbitrary input. Host quotes are real TPMS_ATTEST from the
soft TPM."""

from __future__ import annotations

import hashlib
import os
import uuid as uuid_mod

import hypothesis
import testtools
from hypothesis import strategies as st

from trusted_testing.softtpm import SoftTpm
from verifier.protocol.errors import EvidenceError, MalformedError
from verifier.protocol.hostbatch import (
    LEAF_SIZE,
    BatchProof,
    GuestBatch,
    HostRound,
    guest_leaf,
    host_nonce,
    verify_guest_in_batch,
)
from verifier.protocol.quote import bind_nonce
from verifier.protocol.translog.tree import EMPTY_ROOT, root_from_leaves

PCR = 16
MAX_AGE = 30.0
FUZZ = hypothesis.settings(max_examples=300, deadline=None)


def _guest(i: int) -> tuple[str, bytes]:
    """An instance UUID and a stand-in guest attest (the leaf hashes it)."""
    return str(uuid_mod.UUID(int=0x1000 + i)), b"guest attest %d" % i


class _Host:
    """A host with a soft TPM that quotes a batch's nonce."""

    def __init__(self) -> None:
        self.uuid = str(uuid_mod.uuid4())
        self.tpm = SoftTpm(ak_alg="ecc", ek_alg="ecc")
        self.tpm.extend(PCR, hashlib.sha256(b"host boot").digest())

    def round(
        self,
        batch: GuestBatch,
        *,
        at: float = 1000.0,
        attested: bool = True,
        quoted_root: bytes | None = None,
        quoted_size: int | None = None,
        bound: tuple[bytes, ...] = (),
        quoted_bound: tuple[bytes, ...] | None = None,
    ) -> HostRound:
        fresh = os.urandom(20)
        nonce = host_nonce(
            fresh,
            batch.root if quoted_root is None else quoted_root,
            batch.size if quoted_size is None else quoted_size,
        )
        quoted = bound if quoted_bound is None else quoted_bound
        quote = self.tpm.quote(bind_nonce(nonce, *quoted), (PCR,))
        return HostRound(
            host_uuid=self.uuid,
            fresh_nonce=fresh,
            root=batch.root,
            size=batch.size,
            attest=quote.attest,
            at=at,
            host_attested=attested,
            bound=bound,
        )


class HostBatchTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.host = _Host()
        self.guests = [_guest(i) for i in range(7)]
        self.batch = GuestBatch([guest_leaf(u, a) for u, a in self.guests])
        self.round = self.host.round(self.batch)

    def check(
        self,
        index: int = 3,
        *,
        round: HostRound | None = None,  # noqa: A002
        proof: BatchProof | None = None,
        host: str | None = None,
        guest: tuple[str, bytes] | None = None,
        now: float = 1010.0,
    ) -> None:
        instance, attest = guest or self.guests[index]
        round = round or self.round
        proof = proof or self.batch.proof(index)
        # Both records travel as JSON (the verifier stores them).
        verify_guest_in_batch(
            HostRound.from_dict(round.to_dict()),
            host_uuid=host or self.host.uuid,
            instance_uuid=instance,
            vtpm_attest=attest,
            proof=BatchProof.from_dict(proof.to_dict()),
            now=now,
            max_age=MAX_AGE,
        )

    def assert_refused(self, reason: str, **kw: object) -> EvidenceError:
        with self.assertRaises(EvidenceError) as ctx:
            self.check(**kw)  # type: ignore[arg-type]
        self.assertEqual(reason, ctx.exception.reason)
        return ctx.exception

    # -- good paths ---------------------------------------------------------

    def test_guest_in_batch_passes(self) -> None:
        self.check()

    def test_every_index_of_small_batches_passes(self) -> None:
        for n in (1, 2, 3, 7):
            guests = [_guest(i) for i in range(n)]
            batch = GuestBatch([guest_leaf(u, a) for u, a in guests])
            self.assertEqual(n, batch.size)
            self.assertEqual(
                root_from_leaves([guest_leaf(u, a) for u, a in guests]), batch.root
            )
            round = self.host.round(batch)
            for i in range(n):
                self.check(round=round, proof=batch.proof(i), guest=guests[i])

    def test_every_index_of_a_thousand_passes(self) -> None:
        guests = [_guest(i) for i in range(1000)]
        batch = GuestBatch([guest_leaf(u, a) for u, a in guests])
        round = self.host.round(batch)
        for i in range(1000):
            proof = batch.proof(i)
            self.assertLessEqual(len(proof.path), 10)
            verify_guest_in_batch(
                round,
                host_uuid=self.host.uuid,
                instance_uuid=guests[i][0],
                vtpm_attest=guests[i][1],
                proof=proof,
                now=1000.0,
                max_age=MAX_AGE,
            )

    def test_empty_batch_has_the_empty_root_and_no_proof(self) -> None:
        batch = GuestBatch([])
        self.assertEqual((EMPTY_ROOT, 0), (batch.root, batch.size))
        self.host.round(batch)  # a host round with no guest is a round
        self.assertRaises(MalformedError, batch.proof, 0)

    def test_host_uuid_in_another_spelling_is_the_same_host(self) -> None:
        self.check(host=self.host.uuid.upper())

    def test_round_exactly_max_age_old_passes(self) -> None:
        self.check(now=1000.0 + MAX_AGE)

    # -- attacks ------------------------------------------------------------

    def test_guest_quote_under_another_hosts_root_is_refused(self) -> None:
        # The verifier believes the guest runs on another host: the batch
        # of this host (even with the guest's leaf in it) proves nothing.
        other = _Host()
        exc = self.assert_refused("batch_other_host", host=other.uuid)
        self.assertIn(other.uuid, exc.detail)
        # And the other host's own round, whose tree lacks the guest.
        other_batch = GuestBatch([guest_leaf(*_guest(50 + i)) for i in range(7)])
        self.assert_refused(
            "batch_proof",
            host=other.uuid,
            round=other.round(other_batch),
        )

    def test_stale_root_is_refused(self) -> None:
        self.assert_refused("batch_stale", now=1000.0 + MAX_AGE + 0.5)

    def test_round_judged_after_now_is_refused(self) -> None:
        self.assert_refused("batch_stale", now=999.0)

    def test_forged_proof_is_refused(self) -> None:
        good = self.batch.proof(3)
        path = list(good.path)
        path[1] = bytes([path[1][0] ^ 1]) + path[1][1:]
        self.assert_refused("batch_proof", proof=BatchProof(3, 7, tuple(path)))

    def test_proof_of_another_leaf_is_refused(self) -> None:
        self.assert_refused("batch_proof", proof=self.batch.proof(4))

    def test_guest_quote_not_in_the_batch_is_refused(self) -> None:
        instance, _ = self.guests[3]
        self.assert_refused("batch_proof", guest=(instance, b"another quote"))

    def test_truncated_proof_is_refused(self) -> None:
        good = self.batch.proof(3)
        exc = self.assert_refused("batch_proof", proof=BatchProof(3, 7, good.path[:-1]))
        self.assertIn("bad_proof_length", exc.detail)
        # A proof cut inside a hash does not even parse.
        data = good.to_dict()
        data["path"][-1] = data["path"][-1][:-2]
        self.assertRaises(MalformedError, BatchProof.from_dict, data)

    def test_proof_of_wrong_length_is_refused(self) -> None:
        good = self.batch.proof(3)
        longer = BatchProof(3, 7, (*good.path, good.path[0]))
        exc = self.assert_refused("batch_proof", proof=longer)
        self.assertIn("bad_proof_length", exc.detail)

    def test_proof_for_another_tree_is_refused(self) -> None:
        # A tree of another size: named as such.
        bigger = GuestBatch([guest_leaf(u, a) for u, a in [*self.guests, _guest(9)]])
        exc = self.assert_refused("batch_proof", proof=bigger.proof(3))
        self.assertIn("8 leaves", exc.detail)
        # A tree of the same size with other leaves: the root differs.
        other = GuestBatch([guest_leaf(u, a) for u, a in [*self.guests[:6], _guest(9)]])
        exc = self.assert_refused("batch_proof", proof=other.proof(3))
        self.assertIn("root_mismatch", exc.detail)

    def test_root_quoted_by_unattested_host_is_refused(self) -> None:
        round = self.host.round(self.batch, attested=False)
        exc = self.assert_refused("batch_host_untrusted", round=round)
        self.assertIn(self.host.uuid, exc.detail)

    def test_root_the_host_never_quoted_is_refused(self) -> None:
        other = GuestBatch([guest_leaf(u, a) for u, a in self.guests[:6]])
        quoted_other = self.host.round(self.batch, quoted_root=other.root)
        self.assert_refused("batch_binding", round=quoted_other)
        quoted_bigger = self.host.round(self.batch, quoted_size=8)
        self.assert_refused("batch_binding", round=quoted_bigger)
        # The host's quote of its round under another fresh nonce.
        fields = self.round.to_dict()
        fields["fresh_nonce"] = os.urandom(20).hex()
        self.assert_refused("batch_binding", round=HostRound.from_dict(fields))

    def test_host_quote_binding_the_agents_nk_passes(self) -> None:
        # A pull-mode agent quotes bind_nonce(nonce, NK): no agent change.
        nk = os.urandom(32)
        self.check(round=self.host.round(self.batch, bound=(nk,)))

    def test_round_recorded_without_what_the_agent_bound_is_refused(self) -> None:
        nk = os.urandom(32)
        unbound = self.host.round(self.batch, quoted_bound=(nk,))
        self.assert_refused("batch_binding", round=unbound)
        other = self.host.round(self.batch, bound=(os.urandom(32),), quoted_bound=(nk,))
        self.assert_refused("batch_binding", round=other)

    def test_plain_quote_without_batch_binding_is_refused(self) -> None:
        fields = self.round.to_dict()
        plain = self.host.tpm.quote(
            bind_nonce(bytes.fromhex(fields["fresh_nonce"])), (PCR,)
        )
        fields["attest"] = HostRound(
            self.host.uuid, os.urandom(20), EMPTY_ROOT, 0, plain.attest, 1.0, True
        ).to_dict()["attest"]
        self.assert_refused("batch_binding", round=HostRound.from_dict(fields))

    # -- bad input ----------------------------------------------------------

    def test_leaf_is_domain_separated_and_fixed_size(self) -> None:
        instance, attest = self.guests[0]
        leaf = guest_leaf(instance, attest)
        self.assertEqual(LEAF_SIZE, len(leaf))
        self.assertEqual(leaf, guest_leaf(instance.upper(), attest))
        self.assertNotEqual(leaf, guest_leaf(instance, attest + b"\x00"))
        self.assertRaises(MalformedError, guest_leaf, "not-a-uuid", attest)
        self.assertRaises(MalformedError, GuestBatch, [attest])

    def test_nonce_binds_every_input(self) -> None:
        fresh = bytes(20)
        base = host_nonce(fresh, EMPTY_ROOT, 0)
        self.assertEqual(32, len(base))
        self.assertNotEqual(base, host_nonce(bytes(21), EMPTY_ROOT, 0))
        self.assertNotEqual(base, host_nonce(fresh, bytes(32), 0))
        self.assertNotEqual(base, host_nonce(fresh, EMPTY_ROOT, 1))
        for bad in (
            (b"short", EMPTY_ROOT, 0),
            (fresh, b"x", 0),
            (fresh, EMPTY_ROOT, -1),
        ):
            self.assertRaises(MalformedError, host_nonce, *bad)

    def test_host_round_refuses_bad_fields(self) -> None:
        good = self.round.to_dict()
        bad_values = {
            "host_uuid": "nope",
            "fresh_nonce": "zz",
            "root": "00",
            "size": True,
            "attest": base64_of(b"not an attest"),
            "at": float("nan"),
            "host_attested": 1,
            "bound": ["x" * 20000],
        }
        for field, value in bad_values.items():
            data = dict(good, **{field: value})
            self.assertRaises(MalformedError, HostRound.from_dict, data)
        self.assertRaises(MalformedError, HostRound.from_dict, dict(good, extra=1))
        self.assertRaises(MalformedError, HostRound.from_dict, dict(good, size=0))
        self.assertRaises(
            MalformedError, HostRound.from_dict, dict(good, bound=["AA=="] * 5)
        )
        del good["bound"]  # absent: nothing bound
        self.assertEqual((), HostRound.from_dict(good).bound)

    def test_bad_now_or_max_age_is_malformed(self) -> None:
        for now, age in ((float("inf"), 1.0), (1.0, 0.0), (1.0, -1.0)):
            self.assertRaises(
                MalformedError,
                verify_guest_in_batch,
                self.round,
                host_uuid=self.host.uuid,
                instance_uuid=self.guests[0][0],
                vtpm_attest=self.guests[0][1],
                proof=self.batch.proof(0),
                now=now,
                max_age=age,
            )

    @FUZZ
    @hypothesis.given(st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=80),
        lambda inner: st.lists(inner, max_size=5)
        | st.dictionaries(st.sampled_from(sorted(
            {"index", "size", "path", "host_uuid", "fresh_nonce", "root",
             "attest", "at", "host_attested", "bound", "x"})), inner, max_size=9),
        max_leaves=20,
    ))  # fmt: skip
    def test_from_dict_raises_only_the_cores_errors(self, data: object) -> None:
        for parse in (BatchProof.from_dict, HostRound.from_dict):
            try:
                parse(data)
            except MalformedError:
                pass

    @FUZZ
    @hypothesis.given(
        st.integers(min_value=-2, max_value=10),
        st.integers(min_value=-2, max_value=10),
        st.lists(st.binary(min_size=30, max_size=34), max_size=6),
    )
    def test_mutated_proofs_raise_only_the_cores_errors(
        self, index: int, size: int, path: list[bytes]
    ) -> None:
        try:
            proof = BatchProof.from_dict(
                {"index": index, "size": size, "path": [h.hex() for h in path]}
            )
            self.check(proof=proof)
        except (MalformedError, EvidenceError):
            pass

    def test_from_dict_of_to_dict_is_identity(self) -> None:
        self.assertEqual(self.round, HostRound.from_dict(self.round.to_dict()))
        proof = self.batch.proof(6)
        self.assertEqual(proof, BatchProof.from_dict(proof.to_dict()))


def base64_of(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


class PublishedVectorTest(testtools.TestCase):
    """The test vector of doc/source/admin/deep-quotes.rst."""

    def test_published_test_vector(self) -> None:
        a = guest_leaf("3f2a6c1e-5b1d-4c1e-9a7e-0c6d2b8e4f10", b"attest-a")
        b = guest_leaf("9d1e2c3b-0a4f-4e5d-8c7b-6a5f4e3d2c1b", b"attest-b")
        batch = GuestBatch([a, b])
        nonce = host_nonce(bytes(range(20)), batch.root, 2)
        self.assertEqual(
            (
                "747275737465642d636c6f7564206261746368206c656166207631003f2a6c1e"
                "5b1d4c1e9a7e0c6d2b8e4f10b4ffd60a1dd9959ba34a262067fbf74ecc976809"
                "64b24920f017fcf7babf61b5",
                "a0220e0049afd055e8374dfe85f4b827e0c1f886cb4e9447e5f3b65ced9b6b3c",
                "865ac31a478be77cc9de61ff2740977e01befd163fcd8fc705f3514d5629ba8c",
                "3ecac794f7725bedf34ec2424ad42f0e1234ddb49091909e353a8b126dfa4235",
                ["2965d10e7cedaf6d1b887392db3195b6803c4e3e1334f01afba485386982c0b6"],
            ),
            (
                a.hex(),
                batch.root.hex(),
                nonce.hex(),
                bind_nonce(nonce).hex(),
                batch.proof(0).to_dict()["path"],
            ),
        )
