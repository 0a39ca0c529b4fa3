"""PCR 0's H-CRTM start value on a real TPM (swtpm), against the event-log
replay (issue 32, item 4): the log a firmware writes after an H-CRTM
sequence before TPM2_Startup must replay to what the TPM holds.

(TPM2_Startup from locality 3 is not tried here: the swtpm TCTI of tpm2-tools
sends its commands from locality 0.)"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile

import testtools

from node_agent.trial.eventlog import LegacyLogWriter, LogWriter
from trusted_testing.swtpm import Swtpm, free_port_pair
from verifier.common.tpm import Tpm
from verifier.protocol import (
    AttestationKey,
    EvidenceError,
    PcrPolicy,
    Quote,
    TpmPublic,
    verify_quote,
)
from verifier.protocol.evidence import check_measured_boot
from verifier.protocol.mb import eventlog as ev
from verifier.protocol.mb import parse, replay
from verifier.protocol.mb.replay import STARTUP_LOCALITY
from verifier.protocol.quote import QuoteVerdict

HCRTM_DATA = b"H-CRTM measured before TPM2_Startup"


class PcrZeroStartOnSwtpmTest(testtools.TestCase):
    """A fresh swtpm per test (a power cycle): swtpm does not send
    TPM2_Startup itself, the test does, as the platform would."""

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="test-evlog-swtpm-")
        cls.state = os.path.join(cls.tmp, "state")
        cls.ca = os.path.join(cls.tmp, "localca")
        Swtpm(cls.state, 0, cls.ca).setup()

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        self.tpm = Swtpm(self.state, free_port_pair(), self.ca, startup_clear=False)
        self.tpm.start()
        self.addCleanup(self.tpm.stop)
        self.env = dict(os.environ, TPM2TOOLS_TCTI=self.tpm.tcti)

    def _tpm2(self, *args: str) -> str:
        result = subprocess.run(
            args, env=self.env, capture_output=True, text=True, timeout=60
        )
        self.assertEqual(0, result.returncode, result.stderr)
        return result.stdout

    def _boot(self, log: LogWriter) -> dict[int, bytes]:
        """TPM2_Startup, extend the log's measured events but the H-CRTM's
        (the TPM measured that itself), read sha256 PCRs 0-7."""
        self._tpm2("tpm2_startup", "-c")
        for event in parse(log.build()).events:
            if event.extended and event.event_type != ev.EV_EFI_HCRTM_EVENT:
                digest = event.digests["sha256"].hex()
                self._tpm2("tpm2_pcrextend", f"{event.pcr}:sha256={digest}")
        out = self._tpm2("tpm2_pcrread", "sha256:0,1,2,3,4,5,6,7")
        values = {}
        for line in out.splitlines():
            if ":" in line and "0x" in line:
                index, value = line.split(":")
                values[int(index)] = bytes.fromhex(value.strip()[2:])
        return values

    @staticmethod
    def _log(*first: tuple[int, bytes]) -> LogWriter:
        log = LogWriter()
        for event_type, data in first:
            log.add(0, event_type, data)
        log.add(0, ev.EV_S_CRTM_VERSION, "1.0".encode("utf-16-le") + b"\0\0")
        for pcr in range(8):
            log.add(pcr, ev.EV_SEPARATOR, bytes(4))
        return log

    def _check(self, log: LogWriter, tpm: dict[int, bytes]) -> None:
        ours = replay(parse(log.build()).events, banks=("sha256",))["sha256"]
        self.assertEqual(8, len(tpm))
        self.assertEqual({i: ours[i] for i in range(8)}, tpm)

    def test_hcrtm_sequence_starts_pcr0_at_4_on_swtpm(self) -> None:
        self.tpm.hash_sequence(HCRTM_DATA)
        log = self._log((ev.EV_EFI_HCRTM_EVENT, HCRTM_DATA))
        tpm = self._boot(log)
        self._check(log, tpm)
        with_locality = self._log(
            (ev.EV_NO_ACTION, STARTUP_LOCALITY + b"\x04"),
            (ev.EV_EFI_HCRTM_EVENT, HCRTM_DATA),
        )
        self._check(with_locality, tpm)
        # Replayed from zero, as before this rule, PCR 0 does not match.
        events = parse(log.build()).events[2:]
        self.assertNotEqual(tpm[0], replay(events, banks=("sha256",))["sha256"][0])


class Sha1BankQuoteOnSwtpmTest(testtools.TestCase):
    """Issue 32 item 5 on real TPMs: a legacy SHA-1 log judged against a
    quote over the sha1 and sha256 banks of a TPM manufactured with both,
    and the sha256-only fallback of a TPM manufactured with sha256 alone
    (swtpm_setup's default here: the local CA configuration)."""

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="test-sha1-bank-swtpm-")
        ca = os.path.join(cls.tmp, "localca")
        cls.both = Swtpm(
            os.path.join(cls.tmp, "both"), free_port_pair(), ca, pcr_banks="sha1,sha256"
        )
        cls.sha256 = Swtpm(os.path.join(cls.tmp, "sha256"), free_port_pair(), ca)
        try:
            cls.both.start()
            cls.sha256.start()
        except Exception:
            cls.both.stop()
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        cls.both.stop()
        cls.sha256.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()

    @staticmethod
    def _boot(swtpm: Swtpm) -> bytes:
        """Extend what a TCG 1.2-format firmware measures, each bank with its
        own hash; return the (sha1-only) log it writes."""
        env = dict(os.environ, TPM2TOOLS_TCTI=swtpm.tcti)
        log = LegacyLogWriter()
        measured = [(0, ev.EV_S_CRTM_VERSION, b"1\x00")]
        measured += [(pcr, ev.EV_SEPARATOR, bytes(4)) for pcr in range(8)]
        for pcr, event_type, data in measured:
            log.add(pcr, event_type, data)
            digests = f"sha256={hashlib.sha256(data).hexdigest()}"
            if swtpm.pcr_banks:
                digests = f"sha1={hashlib.sha1(data).hexdigest()}," + digests
            subprocess.run(
                ["tpm2_pcrextend", f"{pcr}:{digests}"],
                env=env,
                check=True,
                capture_output=True,
                timeout=60,
            )
        return log.build()

    def _quote(self, swtpm: Swtpm) -> QuoteVerdict:
        nonce = os.urandom(16)
        with Tpm(swtpm.tcti) as tpm:
            raw = tpm.quote(nonce, list(range(10)), ("sha256", "sha1"))
            ak = AttestationKey(TpmPublic.from_bytes(tpm.ak_public()), True)
        wire = Quote.from_dict(raw.to_dict())  # what the verifier receives
        return verify_quote(wire, ak=ak, qualifying_data=nonce, policy=PcrPolicy({}))

    def test_legacy_log_judged_against_a_sha1_and_sha256_quote_on_swtpm(self) -> None:
        log = self._boot(self.both)
        verdict = self._quote(self.both)
        self.assertEqual(set(range(10)), set(verdict.bank_values["sha1"]))
        check_measured_boot(log, verdict.pcr_values, None, verdict.bank_values)
        # another log than the one the TPM measured is refused on sha1
        other = LegacyLogWriter().add(0, ev.EV_S_CRTM_VERSION, b"2\x00").build()
        exc = self.assertRaises(
            EvidenceError,
            check_measured_boot,
            other,
            verdict.pcr_values,
            None,
            verdict.bank_values,
        )
        self.assertIn("sha1 bank: PCR 0", exc.detail)

    def test_tpm_without_sha1_bank_quotes_sha256_only_on_swtpm(self) -> None:
        log = self._boot(self.sha256)
        verdict = self._quote(self.sha256)
        self.assertEqual({}, dict(verdict.bank_values))
        exc = self.assertRaises(
            EvidenceError,
            check_measured_boot,
            log,
            verdict.pcr_values,
            None,
            verdict.bank_values,
        )
        self.assertEqual("mb_missing_digest", exc.reason)
        self.assertIn("no active sha1 bank", exc.detail)
