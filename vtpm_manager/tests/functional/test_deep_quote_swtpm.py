"""Deep quote on real TPMs: a vTPM state made by the manager (served by
swtpm as the guest would see it) and a host swtpm standing in for the
compute host's hardware TPM."""

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
from verifier.protocol.deepquote import verify_deep_quote
from verifier.protocol.policy import PcrPolicy
from verifier.protocol.quote import AttestationKey, Quote, bind_nonce
from verifier.protocol.tpm import TpmPublic
from vtpm_manager import swtpm_state
from vtpm_manager.deepquote import host_quote

PCR = 16


class DeepQuoteSwtpmTest(testtools.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="vtpm-deepq-")
        cls.tpms: list[Swtpm] = []
        try:
            localca = os.path.join(cls.tmp, "ca")
            cls.instance = str(uuid_mod.uuid4())
            state = swtpm_state.state_dir(os.path.join(cls.tmp, "lib"), cls.instance)
            swtpm_state.create_state(state, localca, f"deepq:{cls.instance}")
            cls.registered_ek = swtpm_state.read_ek(state).ek_public
            for path in (state, os.path.join(cls.tmp, "host")):
                tpm = Swtpm(path, free_port_pair(), localca)
                cls.tpms.append(tpm)
                tpm.start()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        for tpm in cls.tpms:
            tpm.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()

    def test_deep_quote_of_real_vtpm_and_host_tpm(self) -> None:
        vswtpm, hswtpm = self.tpms
        nonce = os.urandom(20)
        with Tpm(vswtpm.tcti) as vtpm, Tpm(hswtpm.tcti) as host:
            self.assertEqual(self.registered_ek, vtpm.ek_public())
            vtpm.pcr_extend(PCR, hashlib.sha256(b"guest").digest())
            host.pcr_extend(PCR, hashlib.sha256(b"host").digest())
            vq = vtpm.quote(bind_nonce(nonce), [PCR])
            vquote = Quote(vq.attest, vq.signature, dict(vq.pcr_values))
            deep = host_quote(
                host, nonce, self.registered_ek, self.instance, vquote, [PCR]
            )
            keys = (
                AttestationKey(TpmPublic.from_bytes(vtpm.ak_public()), True),
                AttestationKey(TpmPublic.from_bytes(host.ak_public()), True),
            )
            policies = (
                PcrPolicy({PCR: frozenset({vtpm.pcr_read([PCR])[PCR]})}),
                PcrPolicy({PCR: frozenset({host.pcr_read([PCR])[PCR]})}),
            )

        def verify(instance: str) -> object:
            return verify_deep_quote(
                deep,
                nonce=nonce,
                instance_uuid=instance,
                vtpm_ek=TpmPublic.from_bytes(self.registered_ek),
                vtpm_ak=keys[0],
                vtpm_policy=policies[0],
                host_ak=keys[1],
                host_policy=policies[1],
            )

        self.assertTrue(verify(self.instance))
        with self.assertRaises(EvidenceError) as ctx:
            verify(str(uuid_mod.uuid4()))
        self.assertEqual("deep_quote_binding", ctx.exception.reason)
