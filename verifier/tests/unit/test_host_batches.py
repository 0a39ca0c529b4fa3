"""Batched deep quotes in the verifier service
(:mod:`verifier.attest.host_batches`): each passing guest quote joins its
host's batch, the host's next quote binds the batch's root, and each guest
then holds an inclusion proof that i29-core's pure check accepts; the
host's attested IMA list proves its swtpm local CA digest. Real quotes of
SoftTpm hosts and guests (a SoftKernel for the host's IMA list)."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from verifier.protocol import PcrPolicy
from verifier.protocol.hostbatch import (
    BatchError,
    HostRound,
    host_nonce,
    verify_guest_in_batch,
)
from verifier.protocol.messages.hosts import DEFAULT_CA_PATH, HostEnrolmentRequest
from verifier.tests.unit.test_attest_runtime import KernelAgentCase
from verifier.tests.unit.test_hosts_service import (
    HostCase,
    RecordingTraits,
    TrustRegistrar,
)

_CA_PEM = b"-----BEGIN CERTIFICATE-----\nswtpm-localca of compute-1\n"


class HostBatchTest(HostCase):
    async def batched_guests(self, count: int = 2) -> tuple[Any, Any, list[Any]]:
        verifier = self.new_verifier()
        host = self.new_agent()
        await self.enrol_host(verifier, host)
        await verifier.rounds.attest_once(host.uuid)  # an empty batch
        guests = []
        for _ in range(count):
            guest = await self.attested_guest(verifier)
            verifier.host_batches.placed(guest.uuid, "compute-1")
            await verifier.rounds.attest_once(guest.uuid)  # a good quote
            guests.append(guest)
        await verifier.rounds.attest_once(host.uuid)
        return verifier, host, guests

    async def test_one_host_quote_binds_every_guest_quote_of_the_interval(
        self,
    ) -> None:
        verifier, host, guests = await self.batched_guests(3)
        self.assertEqual(2, len(host.quote_requests))  # one per host round
        kept = verifier.host_batches.rounds[host.uuid]
        self.assertEqual(3, kept.size)
        asked = bytes.fromhex(host.quote_requests[-1]["nonce"])
        self.assertEqual(host_nonce(kept.fresh_nonce, kept.root, kept.size), asked)
        now = kept.at + 1.0
        for guest in guests:
            proof = verifier.host_batches.proofs[guest.uuid]
            verify_guest_in_batch(
                kept,
                host_uuid=host.uuid,
                instance_uuid=guest.uuid,
                vtpm_attest=proof.vtpm_attest,
                proof=proof.proof,
                now=now,
                max_age=60.0,
            )
        row = verifier.host_store.find("compute-1")
        assert row is not None and row.last_round is not None
        self.assertEqual(kept, HostRound.from_dict(json.loads(row.last_round)))

    async def test_host_view_shows_its_last_rounds_batch(self) -> None:
        verifier, host, _ = await self.batched_guests(3)
        kept = verifier.host_batches.rounds[host.uuid]
        (view,) = await verifier.hosts.list()
        shown = view.to_dict()["last_round"]
        self.assertEqual(
            {"guests": 3, "root": kept.root.hex()},
            {k: shown[k] for k in ("guests", "root")},
        )
        self.assertTrue(shown["at"].endswith("Z"))

    async def test_guest_proof_checked_under_another_host_is_refused(self) -> None:
        verifier, host, (guest,) = await self.batched_guests(1)
        kept = verifier.host_batches.rounds[host.uuid]
        proof = verifier.host_batches.proofs[guest.uuid]
        with self.assertRaises(BatchError) as ctx:
            verify_guest_in_batch(
                kept,
                host_uuid=str(
                    os.urandom(16).hex()[:8] + "-0000-4000-8000-000000000000"
                ),
                instance_uuid=guest.uuid,
                vtpm_attest=proof.vtpm_attest,
                proof=proof.proof,
                now=kept.at,
                max_age=60.0,
            )
        self.assertEqual("batch_other_host", ctx.exception.reason)

    async def test_a_failed_host_round_keeps_no_round_and_no_proof(self) -> None:
        verifier = self.new_verifier()
        host = self.new_agent()
        await self.enrol_host(verifier, host)
        await verifier.rounds.attest_once(host.uuid)
        first = verifier.host_batches.rounds[host.uuid]
        guest = await self.attested_guest(verifier)
        verifier.host_batches.placed(guest.uuid, "compute-1")
        await verifier.rounds.attest_once(guest.uuid)
        host.tpm.extend(16, b"unknown program")
        await verifier.rounds.attest_once(host.uuid)
        self.assertIs(first, verifier.host_batches.rounds[host.uuid])
        self.assertNotIn(guest.uuid, verifier.host_batches.proofs)

    async def test_guest_of_an_unenrolled_host_is_batched_nowhere(self) -> None:
        verifier, host, _ = await self.batched_guests(0)
        guest = await self.attested_guest(verifier, host="compute-9")
        verifier.host_batches.placed(guest.uuid, "compute-9")
        await verifier.rounds.attest_once(guest.uuid)
        await verifier.rounds.attest_once(host.uuid)
        self.assertEqual(0, verifier.host_batches.rounds[host.uuid].size)
        self.assertNotIn(guest.uuid, verifier.host_batches.proofs)


class HostCaProofTest(KernelAgentCase):
    """The host's IMA list (a SoftKernel) measures its CA file."""

    def setUp(self) -> None:
        super().setUp()
        self.registrar = TrustRegistrar()
        self.traits = RecordingTraits()

    async def host_with_its_ca(self) -> tuple[Any, Any]:
        """A host whose kernel measured its CA file, enrolled under the
        runtime policy of what it ran, after its first good round."""
        verifier = self.new_verifier()
        host = self.new_kernel_agent()
        host.kernel.measure(DEFAULT_CA_PATH, _CA_PEM)
        verifier.policies.add("runtime", self.good_policy(host), project="ops")
        request = HostEnrolmentRequest(
            host.uuid, "compute-1", PcrPolicy({}), runtime_policy="golden"
        )
        await verifier.hosts.enrol(request, "ops")
        self.quiesce(verifier)
        await verifier.rounds.attest_once(host.uuid)
        return verifier, host

    async def test_ca_in_the_hosts_attested_ima_list_is_its_proven_ca(self) -> None:
        verifier, host = await self.host_with_its_ca()
        digest = hashlib.sha256(_CA_PEM).hexdigest()
        (view,) = await verifier.hosts.list()
        self.assertEqual(("attested", digest), (view.state, view.ca_sha256))
        await verifier.host_trust.pump()
        name, report = self.registrar.trust[-1]
        self.assertEqual(
            ("compute-1", True, digest), (name, report.trusted, report.ca_sha256)
        )

    async def test_ca_swapped_on_the_host_fails_it_and_marks_it_untrusted(self) -> None:
        verifier, host = await self.host_with_its_ca()
        host.kernel.measure(DEFAULT_CA_PATH, b"another CA")  # swapped
        await verifier.rounds.attest_once(host.uuid)
        (view,) = await verifier.hosts.list()
        self.assertEqual(("revoked", False), (view.state, view.trusted))
        await verifier.host_trust.pump()
        self.assertFalse(self.registrar.trust[-1][1].trusted)


class HostBatchForgetTest(HostCase):
    async def test_deleted_guest_and_deleted_host_leave_no_proof(self) -> None:
        verifier = self.new_verifier()
        host = self.new_agent()
        await self.enrol_host(verifier, host)
        guests = []
        for _ in range(2):
            guest = await self.attested_guest(verifier)
            verifier.host_batches.placed(guest.uuid, "compute-1")
            await verifier.rounds.attest_once(guest.uuid)
            guests.append(guest)
        await verifier.rounds.attest_once(host.uuid)
        self.assertEqual(2, len(verifier.host_batches.proofs))
        await verifier.commands.delete(guests[0].uuid)
        self.assertEqual([guests[1].uuid], list(verifier.host_batches.proofs))
        await verifier.hosts.delete("compute-1")
        self.assertEqual({}, verifier.host_batches.proofs)
        self.assertNotIn(host.uuid, verifier.host_batches.rounds)
