"""The agent's TLS key and certificate survive restarts (node_agent.tls_state)."""

import os
import stat
import tempfile
import uuid as uuid_mod

import testtools

from node_agent.agent import Agent, TpmAccess
from node_agent.exceptions import NodeAgentError
from node_agent.tls_state import CERT_FILE, KEY_FILE
from trusted_testing.softtpm import SoftTpm
from verifier.common.tls import self_signed_certificate


class TlsStateTest(testtools.TestCase):
    def setUp(self):
        super().setUp()
        tmp = tempfile.TemporaryDirectory(prefix="test-tls-state-")
        self.addCleanup(tmp.cleanup)
        self.work_dir = os.path.join(tmp.name, "work")
        self.uuid = str(uuid_mod.uuid4())

    def start(self, uuid=None, host="127.0.0.1"):
        """One agent start on the shared work_dir."""
        return Agent(
            uuid or self.uuid,
            TpmAccess(SoftTpm, shared=True),
            self.work_dir,
            contact_host=host,
        )

    def test_restarted_agent_keeps_its_tls_certificate(self):
        first = self.start()
        second = self.start()
        self.assertEqual(first.tls_cert_pem, second.tls_cert_pem)
        self.assertEqual(first._tls_key_pem, second._tls_key_pem)
        for name in (KEY_FILE, CERT_FILE):
            mode = os.stat(os.path.join(self.work_dir, name)).st_mode
            self.assertEqual(0o600, stat.S_IMODE(mode), name)

    def test_other_node_or_address_gets_a_new_certificate(self):
        first = self.start()
        self.assertNotEqual(first.tls_cert_pem, self.start(host="::1").tls_cert_pem)
        other = self.start(uuid=str(uuid_mod.uuid4()))
        self.assertNotEqual(first.tls_cert_pem, other.tls_cert_pem)

    def test_corrupt_tls_key_is_a_clear_error(self):
        self.start()
        with open(os.path.join(self.work_dir, KEY_FILE), "wb") as f:
            f.write(b"not a key")
        error = self.assertRaises(NodeAgentError, self.start)
        self.assertIn("corrupt agent TLS state", str(error))
        self.assertIn(KEY_FILE, str(error))
        self.assertNotIn("\n", str(error))

    def test_key_not_matching_certificate_is_a_clear_error(self):
        self.start()
        other_key, _ = self_signed_certificate(self.uuid, ["127.0.0.1"])
        with open(os.path.join(self.work_dir, KEY_FILE), "wb") as f:
            f.write(other_key)
        error = self.assertRaises(NodeAgentError, self.start)
        self.assertIn("does not match", str(error))

    def test_key_without_certificate_is_an_interrupted_creation(self):
        # A crash after the key was renamed into place and before the
        # certificate was: no one can have pinned it; a new pair is made.
        first = self.start()
        os.unlink(os.path.join(self.work_dir, CERT_FILE))
        second = self.start()
        self.assertNotEqual(first.tls_cert_pem, second.tls_cert_pem)
        self.assertEqual(second.tls_cert_pem, self.start().tls_cert_pem)

    def test_missing_key_is_a_clear_error(self):
        self.start()
        os.unlink(os.path.join(self.work_dir, KEY_FILE))
        error = self.assertRaises(NodeAgentError, self.start)
        self.assertIn("tls-key.pem is missing", str(error))
