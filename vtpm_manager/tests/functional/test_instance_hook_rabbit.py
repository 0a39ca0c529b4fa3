"""``trusted-nova-listener`` as its own process with the ``vtpm`` hook, on a
RabbitMQ vhost of our own, against the real registrar and verifier
processes: Nova's ``instance.delete.end`` drops the instance's provider EK
registration; a redelivery is harmless; while the registrar is down the
event is requeued until it is back."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import uuid as uuid_mod
from typing import Any

import oslo_messaging
import testtools
from oslo_config import cfg

from trusted_testing import rabbit
from trusted_testing.cluster import LocalCluster, wait_until
from trusted_testing.softtpm import SoftTpm
from verifier.ca import CertificateAuthority
from verifier.common import tls as tlsutil
from vtpm_manager.registrar_client import ProviderRegistrarClient
from vtpm_manager.swtpm_state import EkIdentity


class VtpmHookListenerTest(testtools.TestCase):
    cluster: LocalCluster

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        problem = rabbit.missing()
        if problem:
            raise RuntimeError(f"this test needs {problem}")
        cls.tmp = tempfile.mkdtemp(prefix="vtpm-hook-")
        cls.transport_url, cls.vhost = rabbit.scratch_vhost()
        cls.cluster = LocalCluster(os.path.join(cls.tmp, "c"), nodes=0)
        try:
            cls.cluster.start()
            pki = cls.cluster.pki
            CertificateAuthority.load(pki).issue_to_files(
                pki, "vtpm-manager", ["127.0.0.1", "localhost"]
            )
            cls.cluster.start_nova_listener(
                cls.transport_url,
                hooks=["vtpm"],
                sections={
                    "instance_hook_vtpm": {
                        "registrar_url": cls.cluster.registrar_url,
                        "cert_file": cls.cluster.pki_file("vtpm-manager.pem"),
                        "key_file": cls.cluster.pki_file("vtpm-manager-key.pem"),
                        "ca_file": cls.cluster.pki_file("ca.pem"),
                        "retries": 1,
                        "backoff": 0.2,
                    }
                },
            )
            if not wait_until(cls._queue_declared, 60, 0.5):
                raise RuntimeError("trusted-nova-listener never declared its queue")
            nova_conf = os.path.join(cls.tmp, "nova.conf")
            with open(nova_conf, "w", encoding="utf-8") as f:
                f.write("[DEFAULT]\ncontrol_exchange = nova\n")  # Nova's exchange
            conf = cfg.ConfigOpts()
            conf(["--config-file", nova_conf])
            cls.transport = oslo_messaging.get_notification_transport(
                conf, url=cls.transport_url
            )
            cls.notifier = oslo_messaging.Notifier(
                cls.transport,
                publisher_id="nova-compute:host1",
                driver="messagingv2",
                topics=["versioned_notifications"],
            )
            cls.client = ProviderRegistrarClient(
                cls.cluster.registrar_url,
                tlsutil.client_context(
                    cls.cluster.pki_file("vtpm-manager.pem"),
                    cls.cluster.pki_file("vtpm-manager-key.pem"),
                    cls.cluster.pki_file("ca.pem"),
                ),
                retries=0,
            )
            cls.ek = EkIdentity(SoftTpm(ak_alg="ecc", ek_alg="rsa").ek.to_bytes(), None)
        except Exception:
            cls._tear_down()
            raise

    @classmethod
    def _tear_down(cls) -> None:
        try:
            transport = getattr(cls, "transport", None)
            if transport is not None:
                transport.cleanup()
            cls.cluster.stop()
        finally:
            rabbit.drop_vhost(cls.vhost)
            shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            cls._tear_down()
        finally:
            super().tearDownClass()

    @classmethod
    def _queue_declared(cls) -> bool:
        out = subprocess.run(
            ["rabbitmqctl", "-q", "list_queues", "-p", cls.vhost, "name"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
        return "trusted-cloud" in out

    def registered(self) -> str:
        uuid = str(uuid_mod.uuid4())
        self.assertTrue(self.client.register_ek(uuid, self.ek))
        return uuid

    def delete_end(self, uuid: str) -> None:
        payload: dict[str, Any] = {
            "nova_object.name": "InstanceActionPayload",
            "nova_object.data": {"uuid": uuid},
        }
        self.notifier.info({}, "instance.delete.end", payload)

    def listener_log(self) -> str:
        path = os.path.join(self.cluster.workdir, "nova-listener.log")
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except OSError:
            return ""

    def gone(self, uuid: str) -> bool:
        return self.client.get_ek(uuid) is None

    def test_delete_end_drops_the_ek_and_a_redelivery_is_harmless(self) -> None:
        uuid = self.registered()
        kept = self.registered()
        self.delete_end(uuid)
        self.assertTrue(wait_until(lambda: self.gone(uuid), 30), self.listener_log())
        self.delete_end(uuid)  # Nova (or the bus) delivers it again
        again = f"Instance {uuid}: no provider vTPM EK registered"
        self.assertTrue(
            wait_until(lambda: again in self.listener_log(), 30), self.listener_log()
        )
        self.assertNotIn(
            f"Hook failed on instance.delete.end of {uuid}", self.listener_log()
        )
        self.assertEqual(self.ek, self.client.get_ek(kept))

    def test_event_is_requeued_while_the_registrar_is_down(self) -> None:
        uuid = self.registered()
        registrar = self.cluster.procs["registrar"]
        os.killpg(registrar.pid, signal.SIGTERM)
        registrar.wait(30)
        try:
            self.delete_end(uuid)
            requeued = f"Hook failed on instance.delete.end of {uuid}, requeued"
            self.assertTrue(
                wait_until(lambda: requeued in self.listener_log(), 30),
                self.listener_log(),
            )
        finally:
            self.cluster._start_registrar()  # same port, same database
        self.assertTrue(wait_until(lambda: self.gone(uuid), 30), self.listener_log())
