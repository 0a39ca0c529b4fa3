"""A private RabbitMQ node for tests and benchmarks.

The machine-wide broker is shared and must never be stopped, so outage
tests run their own node: ``rabbitmq-server`` as the current user with its
own node name, AMQP and distribution ports, Mnesia, log and cookie
directories, and no plugins. :meth:`PrivateRabbit.kill` kills it hard
(SIGKILL of its process group) and :meth:`PrivateRabbit.start` brings it
back on the same port with the same Mnesia directory, so durable queues
and persistent messages survive, as with a real broker crash.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid as uuid_mod

from trusted_testing.cluster import die_with_parent, free_port
from trusted_testing.procs import kill_group, listening

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"


class PrivateRabbit:
    """One RabbitMQ node on free ports (guest/guest allowed from localhost).

    Attributes:
        port: the AMQP port.
        url: the oslo.messaging transport URL.
    """

    def __init__(self) -> None:
        if not os.path.exists(SERVER):
            raise RuntimeError(f"{SERVER} missing: apt-get install rabbitmq-server")
        self.port = free_port()
        self.dist_port = free_port()
        self.node = f"tc{uuid_mod.uuid4().hex[:10]}@localhost"
        self.url = f"rabbit://guest:guest@127.0.0.1:{self.port}/"
        self._dir = tempfile.mkdtemp(prefix="trusted-rabbit-")
        for sub in ("mnesia", "log", "home"):
            os.makedirs(os.path.join(self._dir, sub))
        with open(os.path.join(self._dir, "enabled_plugins"), "w") as f:
            f.write("[].\n")
        with open(os.path.join(self._dir, "rabbitmq.conf"), "w") as f:
            f.write("loopback_users = none\n")
        self.log = os.path.join(self._dir, "server.log")
        self._proc: subprocess.Popen[bytes] | None = None

    def _env(self) -> dict[str, str]:
        d = self._dir
        return dict(
            os.environ,
            HOME=os.path.join(d, "home"),
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=os.path.join(d, "mnesia"),
            RABBITMQ_LOG_BASE=os.path.join(d, "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=os.path.join(d, "enabled_plugins"),
            RABBITMQ_CONFIG_FILE=os.path.join(d, "rabbitmq"),
            RABBITMQ_ADVANCED_CONFIG_FILE=os.path.join(d, "advanced.config"),
            RABBITMQ_FEATURE_FLAGS_FILE=os.path.join(d, "feature_flags"),
            RABBITMQ_PID_FILE=os.path.join(d, "pid"),
        )

    def start(self, timeout: float = 180.0) -> None:
        """Start (or restart) the node and wait for its AMQP port."""
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(
                [SERVER],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env(),
                cwd=self._dir,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                with open(self.log, encoding="utf-8", errors="replace") as f:
                    tail = f.read()[-2000:]
                raise RuntimeError(f"rabbitmq-server exited: {tail}")
            if listening(self.port):
                return
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"rabbitmq did not start in {timeout} s; see {self.log}")

    @property
    def running(self) -> bool:
        """Whether the node process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def pause(self) -> None:
        """SIGSTOP the node: it keeps its connections and answers nothing
        (a publish in flight is neither confirmed nor refused)."""
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the node's process group (a crash, not a clean stop)."""
        kill_group(self._proc, self.port)
        self._proc = None

    def cleanup(self) -> None:
        """Kill the node and remove its files."""
        self.kill()
        shutil.rmtree(self._dir, ignore_errors=True)
