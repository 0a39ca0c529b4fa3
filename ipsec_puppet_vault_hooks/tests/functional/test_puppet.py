"""Puppet end to end: a real puppetserver 7.9.5 (Debian), real Puppet
agents, and our verifier with an agent on swtpm.

* ``trusted-puppet-autosign`` is puppetserver's ``autosign`` executable:
  the attested node's request is signed and its agent run succeeds; an
  unknown certname's request stays unsigned.
* The verifier revokes the node (its PCR changes); the signed event is
  handed to the ``puppet`` action, which revokes the certificate through
  the CA API with a client certificate allowed by auth.conf; the node's
  next agent run fails, and a repeat of the action changes nothing.

puppetserver starts once for the class (30 s to several minutes on a
loaded two-core machine); its process group is killed at the end.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import textwrap
import uuid as uuid_mod

import testtools
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from oslo_config import cfg
from testtools.content import text_content

from ipsec_puppet_vault_hooks.actions.puppet import PuppetAction
from trusted_testing.cluster import PCR, LocalCluster, _script, wait_until
from trusted_testing.puppet import (
    HOOK_CERTNAME,
    PuppetServer,
)
from verifier.common import tls as tlsutil
from verifier.common.http import Answer, BlockingClient
from verifier.protocol import PcrPolicy, SignedEvent

PAYLOAD = b"#!/bin/sh\ntrue\n"
CATALOG_NOTICE = "trusted-cloud catalog applied"


def _write(path: str, text: str, mode: int = 0o644) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


class PuppetRevocationTest(testtools.TestCase):
    """One puppetserver and one trusted-boot deployment for the class."""

    tmp: str
    server: PuppetServer
    cluster: LocalCluster

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="trusted-puppet-")
        cls.cluster = LocalCluster(
            os.path.join(cls.tmp, "cluster"), nodes=1, interval=0.5
        )
        root = os.path.join(cls.tmp, "puppetserver")
        os.makedirs(root)
        cls.server = PuppetServer(root, cls._autosign_wrapper())
        try:
            cls.server.launch()  # java starts while the cluster comes up
            cls.cluster.start()
            cls.loop = asyncio.new_event_loop()
            cls.tenant = cls.cluster.tenant()
            cls.node = cls.cluster.nodes[0]
            policy = PcrPolicy.from_dict(
                {"pcrs": {str(PCR): [cls.cluster.good_pcr_hex()]}}
            )
            cls._enrol(cls.node.uuid, policy)
            cls.server.wait_running()
            cls._make_hook_certificate()
        except BaseException:
            cls._cleanup()
            raise

    @classmethod
    def _enrol(cls, uuid: str, policy: PcrPolicy) -> None:
        if not wait_until(lambda: os.path.exists(cls.node.log), 30):
            raise RuntimeError("agent never started")
        for _ in range(120):  # the agent registers with the registrar first
            try:
                cls.loop.run_until_complete(cls.tenant.enrol(uuid, PAYLOAD, policy))
                break
            except Exception:  # noqa: BLE001 (not registered yet)
                cls.loop.run_until_complete(asyncio.sleep(0.5))
        else:
            raise RuntimeError(f"could not enrol {uuid}")

    @classmethod
    def _cleanup(cls) -> None:
        try:
            cls.server.stop()
        finally:
            try:
                if hasattr(cls, "loop"):
                    cls.loop.run_until_complete(cls.tenant.close())
                    cls.loop.close()
            finally:
                cls.cluster.stop()
                shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            cls._cleanup()
        finally:
            super().tearDownClass()

    # -- set-up helpers --------------------------------------------------------

    @classmethod
    def _autosign_wrapper(cls) -> str:
        """Puppet passes the autosign executable no options: a wrapper adds
        our config file."""
        pki = cls.cluster.pki_file
        conf = _write(
            os.path.join(cls.tmp, "autosign.conf"),
            textwrap.dedent(f"""\
                [puppet_autosign]
                verifier_url = {cls.cluster.verifier_url}
                cert_file = {pki("tenant.pem")}
                key_file = {pki("tenant-key.pem")}
                ca_file = {pki("ca.pem")}
                """),
        )
        exe = _script("trusted-puppet-autosign")
        return _write(
            os.path.join(cls.tmp, "autosign.sh"),
            f'#!/bin/sh\nexec "{exe}" --config-file "{conf}" "$@"\n',
            0o755,
        )

    @classmethod
    def _ca(
        cls, method: str, path: str, body: object = None, expect_json: bool = False
    ) -> Answer:
        """A CA API call with the server's own certificate (it carries
        ``pp_cli_auth``, as ``puppetserver ca`` uses it)."""
        s = cls.server
        ctx = tlsutil.client_context(s.host_cert, s.host_key, s.ca_cert)
        return BlockingClient(ctx, 60).request(
            method, s.url + path, json=body, expect_json=expect_json
        )

    @classmethod
    def _make_hook_certificate(cls) -> None:
        """The operator's step: a key and certificate for the revocation
        hook from the Puppet CA (``puppet ssl submit_request`` + ``puppetserver
        ca sign``, done here over the same HTTP API)."""
        key = rsa.generate_private_key(65537, 2048)
        csr = (
            x509.CertificateSigningRequestBuilder()
            .subject_name(
                x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOOK_CERTNAME)])
            )
            .sign(key, hashes.SHA256())
        )
        s = cls.server
        ctx = tlsutil.client_context(None, None, s.ca_cert)
        resp = BlockingClient(ctx, 60).request(
            "PUT",
            f"{s.url}/puppet-ca/v1/certificate_request/{HOOK_CERTNAME}",
            content=csr.public_bytes(serialization.Encoding.PEM),
            headers={"Content-Type": "text/plain"},
            expect_json=False,
        )
        assert resp.status == 200, resp.status
        # The autosign policy refused it (not a node certname).
        status = cls._ca(
            "GET",
            f"/puppet-ca/v1/certificate_status/{HOOK_CERTNAME}",
            expect_json=True,
        )
        assert status.data["state"] == "requested", status
        signed = cls._ca(
            "PUT",
            f"/puppet-ca/v1/certificate_status/{HOOK_CERTNAME}",
            body={"desired_state": "signed"},
        )
        assert signed.status == 204, signed
        cert = cls._ca("GET", f"/puppet-ca/v1/certificate/{HOOK_CERTNAME}")
        cls.hook_cert = _write(os.path.join(cls.tmp, "hook.pem"), cert.body.decode())
        cls.hook_key = _write(
            os.path.join(cls.tmp, "hook-key.pem"),
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ).decode(),
            0o600,
        )

    # -- helpers ---------------------------------------------------------------

    def agent_run(self, certname: str) -> subprocess.CompletedProcess[str]:
        """``puppet agent -t`` for ``certname`` in its own confdir."""
        root = os.path.join(self.tmp, "agents", certname)
        confdir = os.path.join(root, "etc")
        os.makedirs(confdir, exist_ok=True)
        _write(
            os.path.join(confdir, "puppet.conf"),
            textwrap.dedent(f"""\
                [main]
                confdir = {confdir}
                vardir = {root}/var
                codedir = {root}/code
                logdir = {root}/log
                rundir = {root}/run
                ssldir = {root}/ssl
                server = localhost
                serverport = {self.server.port}
                certname = {certname}
                keylength = 2048
                """),
        )
        return subprocess.run(
            [
                "puppet",
                "agent",
                "--test",
                "--confdir",
                confdir,
                "--waitforcert",
                "0",
                "--color",
                "false",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    def cert_state(self, certname: str) -> str | None:
        resp = self._ca(
            "GET", f"/puppet-ca/v1/certificate_status/{certname}", expect_json=True
        )
        return None if resp.status == 404 else str(resp.data["state"])

    def puppet_action(self) -> PuppetAction:
        conf = cfg.ConfigOpts()
        action = PuppetAction(conf)
        conf([])
        for key, value in {
            "server_url": self.server.url,
            "cert_file": self.hook_cert,
            "key_file": self.hook_key,
            "ca_file": self.server.ca_cert,
        }.items():
            conf.set_override(key, value, group="action_puppet")
        return action

    def node_state(self) -> str:
        node = self.loop.run_until_complete(self.tenant.status(self.node.uuid))
        return str(node["state"])

    # -- tests -----------------------------------------------------------------

    def test_unknown_certname_is_not_signed(self) -> None:
        certname = str(uuid_mod.uuid4())
        run = self.agent_run(certname)
        self.assertNotIn(run.returncode, (0, 2), run.stdout + run.stderr)
        self.assertIn("Couldn't fetch certificate", run.stdout + run.stderr)
        self.assertEqual("requested", self.cert_state(certname))
        with open(self.server.log, encoding="utf-8") as f:
            self.assertIn(
                f"node {certname} is not enrolled with the verifier", f.read()
            )

    def test_attested_node_runs_until_revoked(self) -> None:
        self.addDetail(
            "puppetserver-startup-seconds",
            text_content(f"{self.server.startup_seconds:.1f}"),
        )
        uuid = self.node.uuid
        self.assertTrue(
            wait_until(lambda: self.node_state() == "attested", 60),
            "node never attested",
        )
        run = self.agent_run(uuid)
        self.assertIn(run.returncode, (0, 2), run.stdout + run.stderr)
        self.assertIn(CATALOG_NOTICE, run.stdout)
        self.assertEqual("signed", self.cert_state(uuid))

        # The verifier revokes the node and signs the event.
        self.cluster.tamper(self.node)
        self.assertTrue(wait_until(lambda: self.node_state() == "revoked", 30))
        (record,) = self.loop.run_until_complete(self.tenant.events(uuid))
        with open(
            os.path.join(self.cluster.workdir, "event-signing-key.pem"), "rb"
        ) as f:
            public = serialization.load_pem_private_key(f.read(), None).public_key()
        event = SignedEvent.from_dict(record["signed_event"]).verify(public)  # type: ignore[arg-type]

        action = self.puppet_action()
        action.handle(event)
        self.assertEqual("revoked", self.cert_state(uuid))
        action.handle(event)  # a redelivered event changes nothing
        self.assertEqual("revoked", self.cert_state(uuid))

        # puppetserver's CRL lists the node's certificate ...
        crl = x509.load_pem_x509_crl(
            BlockingClient(tlsutil.client_context(None, None, self.server.ca_cert), 60)
            .request(
                "GET",
                f"{self.server.url}/puppet-ca/v1/certificate_revocation_list/ca",
                expect_json=False,
            )
            .body
        )
        ssldir = os.path.join(self.tmp, "agents", uuid, "ssl")
        with open(os.path.join(ssldir, "certs", f"{uuid}.pem"), "rb") as f:
            serial = x509.load_pem_x509_certificate(f.read()).serial_number
        self.assertIsNotNone(crl.get_revoked_certificate_by_serial_number(serial))

        # ... and the node's next agent run fails.
        run = self.agent_run(uuid)
        output = run.stdout + run.stderr
        self.addDetail("agent-run-after-revocation", text_content(output))
        self.assertNotIn(run.returncode, (0, 2), output)
        self.assertNotIn(CATALOG_NOTICE, run.stdout)
        # puppetserver refuses the revoked certificate in the TLS handshake.
        self.assertIn("Could not retrieve catalog from remote server", output)
        self.assertIn("alert certificate unknown", output)
