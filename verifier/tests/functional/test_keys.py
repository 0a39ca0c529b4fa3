"""Keys that die with a revocation, end to end.

Real registrar and verifier processes, agents on swtpm, and a real
``trusted-keyservice`` process, all over mTLS. Nodes get capabilities from
the verifier (only while attested), show them to the key service with their
identity certificates, and use what they get: a LUKS key for a real volume
on a loop device, an LKH group key, a filegroup key under key regression
with Merkle-signed blocks. One tenant revocation reaches the key service as
one signed event (the verifier's ``keyservice`` notifier); the revoked node
is locked out everywhere and the others carry on.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import subprocess
import tempfile
import time
import uuid as uuid_mod
from typing import Any

import requests
import testtools
from cryptography.hazmat.primitives.asymmetric import ed25519

from node_agent.keyclient import KeyClient, KeyServiceError
from trusted_testing.cluster import PCR, LocalCluster, free_port, wait_until
from trusted_testing.e2e import Http
from trusted_testing.keyservice import capability_sections, start_keyservice
from verifier.protocol import PcrPolicy
from verifier.protocol.lkh import LkhError
from verifier.protocol.merkle import BlockVerifier, seal_object
from verifier.protocol.regression import RegressionError

PAYLOAD = b"#!/bin/sh\ntrue\n"


def dm_crypt_refusal() -> str | None:
    """Why this kernel refuses dm-crypt mappings, or None if it takes them.

    ``dmsetup targets`` talks to the kernel's device-mapper driver; when
    the kernel has none, it fails (a /dev/mapper/control node may still
    exist, made by libdevmapper).
    """
    probe = subprocess.run(["dmsetup", "targets"], capture_output=True, text=True)
    if probe.returncode != 0:
        lines = [ln for ln in probe.stderr.splitlines() if ln.strip()]
        return (
            "the kernel refuses device-mapper (dmsetup targets: "
            f"{'; '.join(lines[:2])}): dm-crypt volumes cannot be opened "
            "here; LUKS format and key checks run in the other test"
        )
    return None


class LoopDevice:
    """A loop device on a sparse temporary file (detached on close)."""

    def __init__(self, directory: str, size: int = 32 << 20) -> None:
        self.image = os.path.join(directory, f"luks-{uuid_mod.uuid4().hex}.img")
        with open(self.image, "wb") as f:
            f.truncate(size)
        self.path = subprocess.run(
            ["losetup", "-f", "--show", self.image],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    def close(self) -> None:
        subprocess.run(["losetup", "-d", self.path], check=False)
        os.unlink(self.image)


def cryptsetup(*args: str, key: bytes) -> subprocess.CompletedProcess[bytes]:
    """``cryptsetup`` with the key on stdin (never written to disk)."""
    return subprocess.run(
        ["cryptsetup", "--batch-mode", "--key-file", "-", *args],
        input=key,
        capture_output=True,
        check=False,
    )


class KeysEndToEndTest(testtools.TestCase):
    """One deployment (4 nodes + key service) for the class (~10 s)."""

    cluster: LocalCluster

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="trusted-keys-")
        port = free_port()
        workdir = os.path.join(cls.tmp, "cluster")
        cls.cluster = LocalCluster(
            workdir,
            nodes=4,
            interval=0.5,
            notifiers=("inprocess", "keyservice"),
            verifier_sections=capability_sections(workdir, port),
        )
        try:
            cls.cluster.start()
            cls.ks_url = start_keyservice(cls.cluster, port)
            cls._enrol_all()
        except Exception:
            cls.cluster.stop()
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise

    @classmethod
    def _enrol_all(cls) -> None:
        tenant = cls.cluster.tenant()
        policy = PcrPolicy.from_dict({"pcrs": {str(PCR): [cls.cluster.good_pcr_hex()]}})
        http = Http(cls.cluster)

        def registered(uuid: str) -> bool:
            url = f"{cls.cluster.registrar_url}/v1/agents/{uuid}"
            r = http.call("GET", url)
            return r.status_code == 200 and r.json()["activated"] is True

        loop = asyncio.new_event_loop()
        try:
            for node in cls.cluster.nodes:
                if not wait_until(lambda n=node: registered(n.uuid), 60):
                    raise RuntimeError(f"agent {node.index} never registered")
                loop.run_until_complete(tenant.enrol(node.uuid, PAYLOAD, policy))
            for node in cls.cluster.nodes:
                identity = os.path.join(node.work_dir, "identity.pem")
                if not wait_until(lambda p=identity: os.path.exists(p), 30):
                    raise RuntimeError(f"node {node.index} got no identity")
        finally:
            loop.run_until_complete(tenant.close())
            loop.close()

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            cls.cluster.stop()
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)
            super().tearDownClass()

    # -- helpers ------------------------------------------------------------

    def capability(self, node: Any, obj: str, rights: str) -> requests.Response:
        """Ask the verifier for a capability (as the agent client)."""
        url = f"{self.cluster.verifier_url}/v1/nodes/{node.uuid}/capabilities"
        return Http(self.cluster, "agent").call(
            "POST", url, json={"object": obj, "rights": rights}
        )

    def token(self, node: Any, obj: str, rights: str) -> str:
        r = self.capability(node, obj, rights)
        self.assertEqual(201, r.status_code, r.text)
        return str(r.json()["token"])

    def as_node(
        self, node: Any, method: str, path: str, token: str | None, **kw: Any
    ) -> requests.Response:
        """Call the key service with the node's identity certificate."""
        s = requests.Session()
        s.trust_env = False
        s.cert = (
            os.path.join(node.work_dir, "identity.pem"),
            os.path.join(node.work_dir, "identity-key.pem"),
        )
        s.verify = self.cluster.pki_file("ca.pem")
        headers = {"Authorization": f"Capability {token}"} if token else {}
        return s.request(method, self.ks_url + path, headers=headers, timeout=10, **kw)

    def tenant_ks(self, method: str, path: str, **kw: Any) -> requests.Response:
        return Http(self.cluster).call(method, self.ks_url + path, **kw)

    def put_secret(self, name: str, secret: bytes) -> None:
        body = {"secret": base64.b64encode(secret).decode()}
        r = self.tenant_ks("PUT", f"/v1/secrets/{name}", json=body)
        self.assertEqual(204, r.status_code, r.text)

    def get_secret(self, node: Any, name: str, token: str) -> requests.Response:
        return self.as_node(node, "GET", f"/v1/secrets/{name}", token)

    def revoke(self, node: Any) -> float:
        """Revoke ``node`` through the tenant API; seconds until the key
        service has acted on the event."""
        before = self.tenant_ks("GET", "/v1/stats").json()["revocations"]
        start = time.monotonic()
        url = f"{self.cluster.verifier_url}/v1/nodes/{node.uuid}/revoke"
        r = Http(self.cluster).call("POST", url, json={"detail": "test"})
        self.assertEqual(200, r.status_code, r.text)
        done = wait_until(
            lambda: self.tenant_ks("GET", "/v1/stats").json()["revocations"] > before,
            15,
            0.02,
        )
        self.assertTrue(done, "the key service never got the revocation")
        return time.monotonic() - start

    # -- capabilities, secrets and LUKS ----------------------------------------

    def test_luks_key_by_capability_and_revoked_node_refused(self) -> None:
        survivor, victim = self.cluster.nodes[0], self.cluster.nodes[3]
        luks_key = os.urandom(32)
        self.put_secret("luks-vol1", luks_key)
        held = self.token(victim, "secret:luks-vol1", "r")  # outstanding
        got = self.get_secret(
            victim, "luks-vol1", self.token(victim, "secret:luks-vol1", "r")
        )
        self.assertEqual(200, got.status_code, got.text)
        delivered = base64.b64decode(got.json()["secret"])
        self.assertEqual(luks_key, delivered)
        loop = LoopDevice(self.tmp)
        self.addCleanup(loop.close)
        fmt = cryptsetup(
            "luksFormat", "--type", "luks2", "--pbkdf", "pbkdf2",
            "--pbkdf-force-iterations", "1000", loop.path, key=delivered,
        )  # fmt: skip
        self.assertEqual(0, fmt.returncode, fmt.stderr)
        ok = cryptsetup("open", "--test-passphrase", loop.path, key=delivered)
        self.assertEqual(0, ok.returncode, ok.stderr)
        wrong = cryptsetup("open", "--test-passphrase", loop.path, key=os.urandom(32))
        self.assertNotEqual(0, wrong.returncode)

        self.revoke(victim)
        refused = self.get_secret(victim, "luks-vol1", held)
        self.assertEqual(403, refused.status_code, refused.text)
        self.assertEqual("capability_old_epoch", refused.json()["error"]["code"])
        r = self.capability(victim, "secret:luks-vol1", "r")
        self.assertEqual(409, r.status_code, r.text)
        self.assertEqual("not_attested", r.json()["error"]["code"])
        # the others are unaffected: the survivor unlocks the same volume
        other = self.get_secret(
            survivor, "luks-vol1", self.token(survivor, "secret:luks-vol1", "r")
        )
        self.assertEqual(200, other.status_code, other.text)
        key = base64.b64decode(other.json()["secret"])
        self.assertEqual(
            0, cryptsetup("open", "--test-passphrase", loop.path, key=key).returncode
        )

    def test_dm_crypt_volume_opens_with_delivered_key(self) -> None:
        reason = dm_crypt_refusal()
        if reason:
            self.skipTest(reason)
        node = self.cluster.nodes[0]
        self.put_secret("luks-vol2", os.urandom(32))
        got = self.get_secret(
            node, "luks-vol2", self.token(node, "secret:luks-vol2", "r")
        )
        key = base64.b64decode(got.json()["secret"])
        loop = LoopDevice(self.tmp)
        self.addCleanup(loop.close)
        fmt = cryptsetup(
            "luksFormat", "--type", "luks2", "--pbkdf", "pbkdf2",
            "--pbkdf-force-iterations", "1000", loop.path, key=key,
        )  # fmt: skip
        self.assertEqual(0, fmt.returncode, fmt.stderr)
        name = f"tc-{uuid_mod.uuid4().hex[:12]}"
        opened = cryptsetup("open", loop.path, name, key=key)
        self.assertEqual(0, opened.returncode, opened.stderr)
        self.addCleanup(subprocess.run, ["cryptsetup", "close", name], check=False)
        data = os.urandom(4096)
        with open(f"/dev/mapper/{name}", "r+b") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            f.seek(0)
            self.assertEqual(data, f.read(4096))

    def test_capability_bad_inputs_are_refused_and_counted(self) -> None:
        node, other = self.cluster.nodes[0], self.cluster.nodes[1]
        self.put_secret("s1", b"secret one")
        token = self.token(node, "secret:s1", "r")
        stolen = self.get_secret(other, "s1", token)  # another node's cert
        self.assertEqual("capability_wrong_peer", stolen.json()["error"]["code"])
        body, mac = token.split(".")
        forged = f"{body}.{base64.urlsafe_b64encode(bytes(32)).decode()}"
        r = self.get_secret(node, "s1", forged)
        self.assertEqual("capability_bad_mac", r.json()["error"]["code"])
        fresh = self.token(node, "secret:s1", "r")
        self.assertEqual(200, self.get_secret(node, "s1", fresh).status_code)
        r = self.get_secret(node, "s1", fresh)
        self.assertEqual("capability_replay", r.json()["error"]["code"])
        self.assertEqual(401, self.get_secret(node, "s1", None).status_code)
        stats = self.tenant_ks("GET", "/v1/stats").json()["capabilities_rejected"]
        for reason in ("wrong_peer", "bad_mac", "replay"):
            self.assertGreaterEqual(stats[reason], 1, reason)
        forged_event = {"event": {}, "signature": "AAAA", "key_id": "x"}
        r = Http(self.cluster, "verifier").call(
            "POST", self.ks_url + "/v1/revocations", json=forged_event
        )
        self.assertEqual(400, r.status_code, r.text)

    # -- group keys and filegroups ----------------------------------------------

    def client(self, node: Any) -> KeyClient:
        return KeyClient(
            node.uuid,
            self.cluster.verifier_url,
            self.ks_url,
            (
                self.cluster.pki_file("agent.pem"),
                self.cluster.pki_file("agent-key.pem"),
            ),
            (
                os.path.join(node.work_dir, "identity.pem"),
                os.path.join(node.work_dir, "identity-key.pem"),
            ),
            self.cluster.pki_file("ca.pem"),
        )

    def arun(self, coro):  # type: ignore[no-untyped-def]
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(coro)
        finally:
            loop.close()

    def test_revocation_rekeys_group_and_rotates_filegroup(self) -> None:
        a, b, victim = (
            self.cluster.nodes[0],
            self.cluster.nodes[1],
            self.cluster.nodes[2],
        )
        clients = {n.uuid: self.client(n) for n in (a, b, victim)}
        groups = {u: self.arun(c.join("web")) for u, c in clients.items()}
        keys = {u: self.arun(clients[u].follow(g)) for u, g in groups.items()}
        self.assertEqual(
            1, len(set(keys.values())), "members disagree on the group key"
        )
        writer = ed25519.Ed25519PrivateKey.generate()
        states = {
            n.uuid: self.arun(clients[n.uuid].filegroup_state("docs"))
            for n in (a, victim)
        }
        old = seal_object(
            "report", os.urandom(3 * 4096 + 7), 0, states[a.uuid].key(0), writer
        )

        self.revoke(victim)
        new_a = self.arun(clients[a.uuid].follow(groups[a.uuid]))
        new_b = self.arun(clients[b.uuid].follow(groups[b.uuid]))
        self.assertEqual(new_a, new_b)
        self.assertNotEqual(keys[a.uuid], new_a)
        psk = groups[a.uuid].derive("ipsec-psk")  # e.g. a tenant-wide IPsec PSK
        self.assertEqual(psk, groups[b.uuid].derive("ipsec-psk"))
        self.assertNotEqual(psk, groups[victim.uuid].derive("ipsec-psk"))
        err = self.assertRaises(
            LkhError, self.arun, clients[victim.uuid].follow(groups[victim.uuid])
        )
        self.assertEqual("evicted", err.reason)
        self.assertEqual(
            keys[victim.uuid], groups[victim.uuid].key
        )  # stuck on the old key
        refused = self.assertRaises(
            KeyServiceError, self.arun, clients[victim.uuid].join("web")
        )
        self.assertEqual("not_attested", refused.code)

        fresh = self.arun(clients[a.uuid].filegroup_state("docs"))
        self.assertEqual(1, fresh.version)
        new = seal_object(
            "minutes", b"written after the revocation", 1, fresh.key(1), writer
        )
        verifier = BlockVerifier(writer.public_key())
        for sealed in (old, new):  # old data is read without re-encryption
            for i in range(sealed.header.blocks):
                verifier.read_block(
                    sealed.header, i, sealed.blocks[i], sealed.path(i),
                    fresh.key(sealed.header.version),
                )  # fmt: skip
        revoked = states[victim.uuid]
        self.assertRaises(RegressionError, revoked.key, new.header.version)
        refused = self.assertRaises(
            KeyServiceError, self.arun, clients[victim.uuid].filegroup_state("docs")
        )
        self.assertEqual(409, refused.status)

    def test_node_key_client_fetches_a_secret(self) -> None:
        node = self.cluster.nodes[1]
        self.put_secret("for-client", b"hello")
        self.assertEqual(b"hello", self.arun(self.client(node).secret("for-client")))
