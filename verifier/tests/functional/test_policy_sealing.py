"""Policy-sealed data and monitor attestation end to end (Excalibur).

Real registrar, verifier and agent processes on swtpm, mTLS. The verifier
issues CP-ABE keys for attested, provider-known attributes; a tenant seals
to ``region=eu and hv=kvm-9``: the two matching attested nodes open the
payload, the non-matching one cannot, and after a revocation the revoked
node gets no new key and cannot open what is sealed afterwards (it keeps
what it could open before: ABE cannot take back a key). The verifier host
has its own swtpm and proves its integrity to customers with batched
quotes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import shutil
import tempfile
from typing import Any

import testtools

from nova_plugin.cmd import main as tenant_main
from nova_plugin.exceptions import AttestationFailedError, ServiceError
from nova_plugin.monitor import load_pinned_ak, monitor_attest, trust_monitor_ak
from nova_plugin.policy_seal import fetch_params, seal_to_policy, send_sealed
from trusted_testing.cluster import PCR, LocalCluster, expected_pcr, wait_until
from trusted_testing.e2e import Http
from trusted_testing.swtpm import Swtpm, ek_ca_bundle, free_port_pair
from verifier.common.tpm import Tpm
from verifier.protocol import PcrPolicy
from verifier.protocol.abe import PolicyError

INTERVAL = 0.5
PAYLOAD = b"#!/bin/sh\ntrue\n"
HOST_MEASUREMENT = hashlib.sha256(b"verifier release 1").digest()
EU = {"region": "eu", "hv": "kvm-9", "az": "eu-1a", "image": "sha256:ab12"}
US = {"region": "us", "hv": "kvm-9", "az": "us-2b", "image": "sha256:ab12"}
POLICY = "region=eu and hv=kvm-9"


class PolicySealingTest(testtools.TestCase):
    """One deployment of 4 nodes and a verifier host TPM (~10 s)."""

    cluster: LocalCluster
    host_tpm: Swtpm
    tmp: str

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="policy-sealing-")
        cls.host_ca = os.path.join(cls.tmp, "host-localca")
        cls.host_tpm = Swtpm(
            os.path.join(cls.tmp, "host-tpm"), free_port_pair(), cls.host_ca
        )
        cls.attributes_file = os.path.join(cls.tmp, "provider-attributes.json")
        cls.cluster = LocalCluster(
            os.path.join(cls.tmp, "cluster"),
            nodes=4,
            interval=INTERVAL,
            verifier_sections={
                "abe": {
                    "enabled": True,
                    "master_key_file": os.path.join(cls.tmp, "abe", "master.key"),
                    "provider_attributes_file": cls.attributes_file,
                },
                "monitor": {
                    "enabled": True,
                    "tcti": cls.host_tpm.tcti,
                    "pcrs": [str(PCR)],
                    "window_ms": 20,
                },
            },
        )
        try:
            cls.host_tpm.start()
            with Tpm(cls.host_tpm.tcti) as tpm:
                tpm.pcr_extend(PCR, HOST_MEASUREMENT)
            cls.cluster.start()
            eu1, eu2, us, eu_revoked = cls.cluster.nodes
            table = {
                eu1.uuid: dict(EU, host="cn-1"),
                eu2.uuid: dict(EU, host="cn-1"),
                us.uuid: dict(US, host="cn-7"),
                eu_revoked.uuid: dict(EU, host="cn-1"),
            }
            with open(cls.attributes_file, "w", encoding="utf-8") as f:
                json.dump(table, f)
        except Exception:
            cls._stop()
            raise
        cls.loop = asyncio.new_event_loop()
        cls.tenant = cls.cluster.tenant()
        cls.policy = PcrPolicy.from_dict(
            {"pcrs": {str(PCR): [cls.cluster.good_pcr_hex()]}}
        )
        try:
            for node in cls.cluster.nodes:
                wait_until(
                    lambda n=node: cls._registered(n.uuid),
                    60,
                    what=f"agent {node.index} registered",
                )
                cls.loop.run_until_complete(
                    cls.tenant.enrol(node.uuid, PAYLOAD, cls.policy)
                )
        except Exception:
            cls.tearDownClass()
            raise

    @classmethod
    def _registered(cls, uuid: str) -> bool:
        async def activated() -> bool:
            try:
                await cls.tenant.identity(uuid)
            except ServiceError:
                return False
            return True

        return cls.loop.run_until_complete(activated())

    @classmethod
    def _stop(cls) -> None:
        try:
            cls.cluster.stop()
        finally:
            cls.host_tpm.stop()
            shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            cls.loop.run_until_complete(cls.tenant.close())
            cls.loop.close()
        finally:
            cls._stop()
            super().tearDownClass()

    def arun(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def keys_of(self, uuid: str) -> list[dict[str, Any]]:
        answer = self.arun(self.tenant.agent_request(uuid, "GET", "/v1/abe"))
        return list(answer["keys"])

    def wait_key(self, uuid: str, epoch: int) -> dict[str, Any]:
        def has() -> dict[str, Any] | None:
            return next((k for k in self.keys_of(uuid) if k["epoch"] == epoch), None)

        key = wait_until(has, 30, what=f"node {uuid}'s epoch {epoch} key")
        return dict(key)

    def opened(self, uuid: str, blob: bytes) -> bytes:
        answer = self.arun(send_sealed(self.tenant, uuid, blob))
        with open(answer["path"], "rb") as f:
            return f.read()

    def assert_refused(self, uuid: str, blob: bytes, code: str) -> None:
        exc = self.assertRaises(
            ServiceError, self.arun, send_sealed(self.tenant, uuid, blob)
        )
        self.assertIn(code, str(exc))

    # -- policy sealing ---------------------------------------------------

    def test_policy_sealed_payload_opens_exactly_on_matching_attested_nodes(
        self,
    ) -> None:
        eu1, eu2, us, eu_revoked = self.cluster.nodes
        params = self.arun(fetch_params(self.tenant))
        epoch = params.epoch
        keys = {n.uuid: self.wait_key(n.uuid, epoch) for n in self.cluster.nodes}
        # the quote's pcrDigest: SHA-256 over the quoted PCR values
        digest = hashlib.sha256(bytes.fromhex(self.cluster.good_pcr_hex()))
        pcrs = f"pcrs={digest.hexdigest()}"
        self.assertEqual(
            sorted(
                [f"{k}={v}" for k, v in dict(EU, host="cn-1").items()]
                + [pcrs, f"epoch={epoch}", f"project={params.project}"]
            ),
            keys[eu1.uuid]["attributes"],
        )
        # identical configurations share one cached key; others do not
        self.assertEqual(keys[eu1.uuid]["fingerprint"], keys[eu2.uuid]["fingerprint"])
        self.assertNotEqual(keys[eu1.uuid]["fingerprint"], keys[us.uuid]["fingerprint"])

        secret = os.urandom(1024)
        before = seal_to_policy(params, POLICY, secret)
        for node in (eu1, eu2, eu_revoked):
            self.assertEqual(secret, self.opened(node.uuid, before))
        self.assertRaises(ServiceError, self.opened, us.uuid, before)
        self.assert_refused(us.uuid, before, "policy_not_satisfied")

        # revocation: a new epoch; the revoked node is not keyed for it
        self.arun(self.tenant.revoke(eu_revoked.uuid, "test"))
        new_epoch = wait_until(
            lambda: (e := self.arun(fetch_params(self.tenant))).epoch > epoch and e,
            10,
        )
        self.assertEqual(epoch + 1, new_epoch.epoch)
        for node in (eu1, eu2, us):
            self.wait_key(node.uuid, new_epoch.epoch)
        after = seal_to_policy(new_epoch, POLICY, b"sealed after revocation")
        for node in (eu1, eu2):
            self.assertEqual(b"sealed after revocation", self.opened(node.uuid, after))
        self.assert_refused(us.uuid, after, "policy_not_satisfied")
        self.assertEqual([epoch], [k["epoch"] for k in self.keys_of(eu_revoked.uuid)])
        self.assert_refused(eu_revoked.uuid, after, "policy_not_satisfied")
        # honest limit: what was sealed before the revocation stays open to it
        self.assertEqual(secret, self.opened(eu_revoked.uuid, before))

    def tenant_cli(self, *args: str) -> str:
        """``trusted-tenant`` in this process (its entry point, its parser)."""
        env = self.cluster.tenant_env()
        options = [
            f"--registrar={env['TRUSTED_REGISTRAR_URL']}",
            f"--verifier={env['TRUSTED_VERIFIER_URL']}",
            f"--cert={env['TRUSTED_CERT']}",
            f"--key={env['TRUSTED_KEY']}",
            f"--ca={env['TRUSTED_CA']}",
        ]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = tenant_main([*options, *args])
        self.assertEqual(0, code, err.getvalue())
        return out.getvalue()

    def test_tenant_cli_seals_to_a_policy_and_checks_the_verifier(self) -> None:
        node = self.cluster.nodes[1]  # region=eu, hv=kvm-9, never revoked
        epoch = self.arun(fetch_params(self.tenant)).epoch
        self.wait_key(node.uuid, epoch)
        payload = os.path.join(self.tmp, "cli-payload")
        with open(payload, "wb") as f:
            f.write(b"cli secret")
        blob = os.path.join(self.tmp, "cli-payload.sealed")
        out = self.tenant_cli(
            "seal", "--seal-policy", POLICY, "--payload", payload, "--out", blob
        )
        self.assertIn(f"and epoch={epoch}", out)
        out = self.tenant_cli("--json", "send-sealed", node.uuid, "--blob", blob)
        with open(json.loads(out)["path"], "rb") as f:
            self.assertEqual(b"cli secret", f.read())
        pin = os.path.join(self.tmp, "verifier-ak.pin")
        ek_ca = os.path.join(self.tmp, "host-ek-ca.pem")
        with open(ek_ca, "wb") as f:
            f.write(ek_ca_bundle(self.host_ca))
        self.tenant_cli("monitor-trust", "--ek-ca", ek_ca, "--out", pin)
        value = expected_pcr(HOST_MEASUREMENT).hex()
        out = self.tenant_cli("monitor-attest", "--ak", pin, "--pcr", f"{PCR}={value}")
        self.assertIn("proved its integrity", out)

    # -- monitor attestation ----------------------------------------------

    def host_policy(self, measurement: bytes = HOST_MEASUREMENT) -> PcrPolicy:
        return PcrPolicy.from_dict(
            {"pcrs": {str(PCR): [expected_pcr(measurement).hex()]}}
        )

    def test_customers_attest_the_verifier_in_batches(self) -> None:
        ak_raw = self.arun(trust_monitor_ak(self.tenant, ek_ca_bundle(self.host_ca)))
        ak = load_pinned_ak(ak_raw)

        async def many() -> list[Any]:
            return await asyncio.gather(
                *(
                    monitor_attest(self.tenant, ak, self.host_policy())
                    for _ in range(40)
                )
            )

        verdicts = self.arun(many())
        self.assertEqual(40, len(verdicts))
        self.assertGreater(max(v.size for v in verdicts), 1)
        # another TPM vendor's CA (the nodes' swtpm CA): the EK cert does not chain
        other_ca = ek_ca_bundle(self.cluster.localca)
        exc = self.assertRaises(
            AttestationFailedError, self.arun, trust_monitor_ak(self.tenant, other_ca)
        )
        self.assertIn("ek_certificate", str(exc))
        # a verifier host that is not in the state the customer accepts
        exc = self.assertRaises(
            AttestationFailedError,
            self.arun,
            monitor_attest(self.tenant, ak, self.host_policy(b"\x01" * 32)),
        )
        self.assertIn("pcr_policy", str(exc))

    def test_bad_monitor_and_sealing_requests_get_clear_json_errors(self) -> None:
        http = Http(self.cluster)
        base = self.cluster.verifier_url
        for nonce, code in (("zz", "bad_field"), ("00" * 8, "malformed")):
            r = http.call("GET", f"{base}/v1/monitor/attest?nonce={nonce}")
            self.assertEqual(400, r.status_code, r.text)
            self.assertEqual(code, r.json()["error"]["code"])
        r = http.call("POST", f"{base}/v1/monitor/activate", json={"x": 1})
        self.assertEqual(400, r.status_code, r.text)
        # an agent certificate is not a tenant: no parameters, no monitor
        agent = Http(self.cluster, "agent")
        for path in ("/v1/abe/params", f"/v1/monitor/attest?nonce={'00' * 32}"):
            r = agent.call("GET", base + path)
            self.assertEqual(403, r.status_code, r.text)
        node = self.cluster.nodes[0]
        for blob, code in ((b"garbage", "malformed"), (b"", "malformed")):
            exc = self.assertRaises(
                ServiceError, self.arun, send_sealed(self.tenant, node.uuid, blob)
            )
            self.assertIn(code, str(exc))
        params = self.arun(fetch_params(self.tenant))
        exc = self.assertRaises(
            PolicyError, seal_to_policy, params, "region=eu and", b"x"
        )
        self.assertEqual(13, exc.position)
