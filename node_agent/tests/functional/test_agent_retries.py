"""``trusted-agent`` as a process, on the terminal: what an operator sees
when the TCTI is mistyped, the TPM does not answer or the registrar is
down (issue 33: a TCTI typo retried for ever under four tpm2-tss ERROR
lines per try; a registrar down logged once, then 10 minutes of silence).

The agent runs as ``python -m node_agent.cmd`` with its log on stderr, a
real swtpm for the registrar case, and loopback ports where nothing
listens.
"""

import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid as uuid_mod

from node_agent.cmd import BACKOFF_FIRST
from trusted_testing.swtpm_case import SwtpmTestCase
from verifier.ca import CertificateAuthority

#: Only a guard against a hung child, never an assertion on time.
_GUARD = 120.0
_FAILED = re.compile(
    r"registration of node \S+ failed \(attempt (\d+), failing for \d+ s\): "
    r"(.*); next attempt in (\d+) s"
)


def _dead_port() -> int:
    """A loopback port where nothing listens (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class AgentOnTheTerminalTest(SwtpmTestCase):
    prefix = "test-agent-retries-"

    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp(dir=self.tmp)
        ca = CertificateAuthority.create(os.path.join(self.dir, "ca"), "test CA")
        self.ca_file = os.path.join(self.dir, "ca.pem")
        with open(self.ca_file, "wb") as f:
            f.write(ca.cert_pem)

    def start_agent(self, tcti, registrar_url=None):
        conf = os.path.join(self.dir, "agent.conf")
        with open(conf, "w") as f:
            f.write("[DEFAULT]\nuse_stderr = true\n[agent]\n")
            f.write(f"uuid = {uuid_mod.uuid4()}\ntcti = {tcti}\nport = 0\n")
            f.write(f"ca_file = {self.ca_file}\n")
            f.write(f"work_dir = {os.path.join(self.dir, 'work')}\n")
            f.write(f"bootstrap_file = {os.path.join(self.dir, 'absent.json')}\n")
            f.write("user_data_file =\ninstance_data_file =\ninstance_id_file =\n")
            if registrar_url:
                f.write(f"registrar_url = {registrar_url}\n")
        env = dict(os.environ)
        env.pop("TSS2_LOG", None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "node_agent.cmd", "--config-file", conf],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.addCleanup(self._stop, proc)
        return proc

    @staticmethod
    def _stop(proc):
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stderr.close()

    def read_failures(self, proc, count):
        """stderr until ``count`` failed attempts are logged; (their
        (attempt, cause, next) tuples, all of stderr)."""
        text, failures = b"", []
        deadline = time.monotonic() + _GUARD
        fd = proc.stderr.fileno()
        while len(failures) < count and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                text += chunk
            failures = _FAILED.findall(text.decode(errors="replace"))
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=_GUARD)
        return failures, (text + rest).decode(errors="replace")

    def test_tcti_module_typo_exits_2_with_one_line(self):
        proc = self.start_agent("swtmp:host=127.0.0.1,port=2321", "https://127.0.0.1:1")
        _, err = proc.communicate(timeout=_GUARD)
        text = err.decode()
        self.assertEqual(2, proc.returncode, text)
        self.assertEqual(1, len(text.splitlines()), text)
        self.assertIn("trusted-agent: configuration error: [agent] tcti", text)
        self.assertIn("no TCTI module 'swtmp' can be loaded", text)
        self.assertNotIn("ERROR:tcti", text)

    def test_tcti_options_typo_exits_2_without_tss_chatter(self):
        tcti = f"swtpm:host=127.0.0.1,prt={self.swtpm.port}"
        proc = self.start_agent(tcti, f"https://127.0.0.1:{_dead_port()}")
        _, err = proc.communicate(timeout=_GUARD)
        text = err.decode()
        self.assertEqual(2, proc.returncode, text)
        self.assertIn(
            f"trusted-agent: configuration error: TCTI '{tcti}' cannot be loaded", text
        )
        self.assertNotIn("ERROR:tcti", text)
        self.assertNotIn("Traceback", text)

    def test_tpm_that_does_not_answer_is_retried_with_one_line_a_try(self):
        tcti = f"swtpm:host=127.0.0.1,port={_dead_port()}"
        proc = self.start_agent(tcti, f"https://127.0.0.1:{_dead_port()}")
        failures, text = self.read_failures(proc, 3)
        self.assertEqual(["1", "2", "3"], [f[0] for f in failures], text)
        for _, cause, _ in failures:
            self.assertIn(f"TPM error: the TPM at '{tcti}' does not answer", cause)
        self.assertEqual(
            [BACKOFF_FIRST, 2 * BACKOFF_FIRST, 4 * BACKOFF_FIRST],
            [float(f[2]) for f in failures],
        )
        # tpm2-tss printed four ERROR/WARNING lines per try before
        self.assertNotIn(":tcti:", text)
        self.assertNotIn("Traceback", text)

    def test_registrar_down_is_logged_at_every_attempt(self):
        url = f"https://127.0.0.1:{_dead_port()}"
        proc = self.start_agent(self.swtpm.tcti, url)
        failures, text = self.read_failures(proc, 3)
        self.assertEqual(["1", "2", "3"], [f[0] for f in failures], text)
        for _, cause, _ in failures:
            self.assertIn("127.0.0.1", cause)
            self.assertNotIn("TPM error", cause)
        self.assertEqual(
            [BACKOFF_FIRST, 2 * BACKOFF_FIRST, 4 * BACKOFF_FIRST],
            [float(f[2]) for f in failures],
        )
