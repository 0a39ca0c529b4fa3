"""Batched deep quotes on a real TPM: swtpm as the host TPM quotes a batch's
32-byte nonce through the agent's own TPM code (verifier.common.tpm), the
verifier judges the quote and checks every guest of the batch; a root the
host never quoted is refused."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid as uuid_mod

import testtools

from trusted_testing.swtpm import Swtpm, free_port_pair
from verifier.common.tpm import Tpm
from verifier.protocol import EvidenceError
from verifier.protocol.hostbatch import (
    GuestBatch,
    HostRound,
    guest_leaf,
    host_nonce,
    verify_guest_in_batch,
)
from verifier.protocol.messages.quote import NONCE_MAX
from verifier.protocol.policy import PcrPolicy
from verifier.protocol.quote import AttestationKey, Quote, bind_nonce, verify_quote
from verifier.protocol.tpm import TpmPublic

PCR = 16


class HostBatchSwtpmTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        tmp = tempfile.mkdtemp(prefix="hostbatch-swtpm-")
        self.addCleanup(shutil.rmtree, tmp, True)
        swtpm = Swtpm(
            os.path.join(tmp, "host"), free_port_pair(), os.path.join(tmp, "ca")
        )
        swtpm.start()
        self.addCleanup(swtpm.stop)
        self.tpm = Tpm(swtpm.tcti)
        self.addCleanup(self.tpm.close)
        self.tpm.pcr_extend(PCR, hashlib.sha256(b"host boot").digest())
        self.host = str(uuid_mod.uuid4())
        self.nk = os.urandom(32)
        self.guests = [(str(uuid_mod.uuid4()), os.urandom(120)) for _ in range(5)]
        self.batch = GuestBatch([guest_leaf(u, a) for u, a in self.guests])

    def judge(self, fresh: bytes, root: bytes, size: int) -> HostRound:
        """The host agent quotes the nonce; the verifier judges the quote."""
        nonce = host_nonce(fresh, root, size)
        self.assertLessEqual(len(nonce), NONCE_MAX)  # fits the agent's request
        # as the agent quotes in pull mode: the nonce bound to its NK
        q = self.tpm.quote(bind_nonce(nonce, self.nk), [PCR])
        quote = Quote(q.attest, q.signature, dict(q.pcr_values))
        verify_quote(
            quote,
            ak=AttestationKey(TpmPublic.from_bytes(self.tpm.ak_public()), True),
            qualifying_data=bind_nonce(nonce, self.nk),
            policy=PcrPolicy({PCR: frozenset({self.tpm.pcr_read([PCR])[PCR]})}),
        )
        return HostRound(
            self.host, fresh, root, size, quote.attest, 50.0, True, (self.nk,)
        )

    def check(self, host_round: HostRound, index: int) -> None:
        instance, attest = self.guests[index]
        verify_guest_in_batch(
            host_round,
            host_uuid=self.host,
            instance_uuid=instance,
            vtpm_attest=attest,
            proof=self.batch.proof(index),
            now=60.0,
            max_age=30.0,
        )

    def test_every_guest_of_a_real_host_quote_passes(self) -> None:
        host_round = self.judge(os.urandom(20), self.batch.root, self.batch.size)
        for i in range(len(self.guests)):
            self.check(host_round, i)

    def test_root_the_real_host_never_quoted_is_refused(self) -> None:
        fresh = os.urandom(20)
        quoted = self.judge(fresh, self.batch.root, self.batch.size + 1)
        claimed = HostRound(
            self.host,
            fresh,
            self.batch.root,
            self.batch.size,
            quoted.attest,
            50.0,
            True,
        )
        with self.assertRaises(EvidenceError) as ctx:
            self.check(claimed, 0)
        self.assertEqual("batch_binding", ctx.exception.reason)
