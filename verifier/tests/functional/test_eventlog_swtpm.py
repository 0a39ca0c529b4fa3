"""PCR 0's H-CRTM start value on a real TPM (swtpm), against the event-log
replay (issue 32, item 4): the log a firmware writes after an H-CRTM
sequence before TPM2_Startup must replay to what the TPM holds.

(TPM2_Startup from locality 3 is not tried here: the swtpm TCTI of tpm2-tools
sends its commands from locality 0.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import testtools

from node_agent.trial.eventlog import LogWriter
from trusted_testing.swtpm import Swtpm, free_port_pair
from verifier.protocol.mb import eventlog as ev
from verifier.protocol.mb import parse, replay
from verifier.protocol.mb.replay import STARTUP_LOCALITY

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
