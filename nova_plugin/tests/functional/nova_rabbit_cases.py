# ruff: noqa: I001  (nova must be imported before anything that imports eventlet)
"""(Run in a process of their own by test_nova_rabbit.py.)

Nova's versioned notifications over a real RabbitMQ bus (a vhost of our
own on the machine's broker) to ``trusted-nova-listener`` running as its
own process: enrolment follows the instance across processes.
"""

from __future__ import annotations

import os

os.environ["OS_NOVA_DISABLE_EVENTLET_PATCHING"] = "1"

from nova_plugin.tests.functional import nova_boot_cases as base  # noqa: E402

import json  # noqa: E402
import subprocess  # noqa: E402

from trusted_testing import rabbit  # noqa: E402
from trusted_testing.cluster import wait_until  # noqa: E402


class NovaRabbitListenerTest(base.NovaBootBase):
    vhost: str

    @classmethod
    def setUpClass(cls) -> None:
        problem = rabbit.missing()
        if problem:
            raise RuntimeError(f"this test needs {problem}")
        cls.transport_url, cls.vhost = rabbit.scratch_vhost()
        try:
            super().setUpClass()
            cls.cluster.start_nova_listener(cls.transport_url)
            if not wait_until(cls._queue_declared, 60, 0.5):
                raise RuntimeError("trusted-nova-listener never declared its queue")
        except Exception:
            rabbit.drop_vhost(cls.vhost)
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            super().tearDownClass()
        finally:
            rabbit.drop_vhost(cls.vhost)

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

    def test_listener_process_follows_the_instance_over_rabbitmq(self) -> None:
        code, out, err = self.run_cli(self.boot_argv())
        self.assertEqual(0, code, err)
        uuid = json.loads(out.splitlines()[0])["id"]
        self._wait_for_state_change({"id": uuid}, "ACTIVE")
        created = wait_until(
            lambda: (self.node(uuid) or {}).get("state") == "created", 30
        )
        self.assertTrue(created, self.node(uuid))
        self.api.delete_server(uuid)
        self._wait_until_deleted({"id": uuid})
        self.assertTrue(
            wait_until(lambda: self.node(uuid) is None, 30), self.node(uuid)
        )
