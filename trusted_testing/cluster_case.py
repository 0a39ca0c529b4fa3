"""A test case base with one real deployment (:class:`LocalCluster`) shared
by its class: registrar, verifier and ``node_count`` agents on swtpm,
started once, every agent registered (AK activated) before the first test,
a tenant client and an event loop to drive it; all stopped, and the work
directory removed, after the last test."""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, ClassVar, TypeVar

import testtools

from nova_plugin.tenant import Tenant
from trusted_testing.cluster import LocalCluster, NodeHandle, free_port, wait_until
from trusted_testing.e2e import Http
from trusted_testing.softkernel import SoftKernel

T = TypeVar("T")


def script(name: str) -> str:
    """A console script of the Python running the tests."""
    return os.path.join(os.path.dirname(sys.executable), name)


class ClusterTestCase(testtools.TestCase):
    """One :class:`LocalCluster` for the class, described by the class
    attributes below; :meth:`prepare` and :meth:`set_up_cluster` are the
    subclass's hooks (before the agents start, after they registered)."""

    #: the prefix of the class's work directory
    prefix: ClassVar[str] = "trusted-cluster-"
    #: how many nodes (agents on swtpm)
    node_count: ClassVar[int] = 1
    #: the verifier's quote interval (seconds)
    interval: ClassVar[float] = 0.5
    #: each node gets a soft firmware and kernel (event log and IMA list)
    evidence: ClassVar[bool] = False
    #: files (path, content) each node's soft kernel measures before its
    #: agent uses the TPM (needs ``evidence``)
    measured: ClassVar[tuple[tuple[str, bytes], ...]] = ()
    #: the verifier takes pushed evidence on ``cls.push_url``
    push: ClassVar[bool] = False
    #: extra ``[verifier]`` options
    verifier_options: ClassVar[Mapping[str, Any]] = {}
    #: extra ``[registrar]`` options
    registrar_options: ClassVar[Mapping[str, Any]] = {}
    #: how long :meth:`wait_for` waits by default (seconds)
    wait_timeout: ClassVar[float] = 20.0

    tmp: ClassVar[str]
    cluster: ClassVar[LocalCluster]
    http: ClassVar[Http]
    tenant: ClassVar[Tenant]
    loop: ClassVar[asyncio.AbstractEventLoop]
    push_url: ClassVar[str]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix=cls.prefix)
        sections: dict[str, dict[str, Any]] = {}
        if cls.push:
            port = free_port()
            cls.push_url = f"https://127.0.0.1:{port}"
            sections["push"] = {"port": port, "min_interval": 0.1, "challenge_ttl": 5.0}
        cls.cluster = LocalCluster(
            os.path.join(cls.tmp, "cluster"),
            nodes=cls.node_count,
            interval=cls.interval,
            evidence=cls.evidence,
            verifier_options=dict(cls.verifier_options),
            verifier_sections=sections,
            registrar_options=dict(cls.registrar_options),
        )
        cls.loop = asyncio.new_event_loop()
        try:
            cls.cluster.start_services()
            cls.prepare()
            for node in cls.cluster.nodes:  # before the agents use the TPMs
                for path, content in cls.measured:
                    cls.kernel(node).measure(path, content)
                cls.cluster.start_agent(node)
            cls.http = Http(cls.cluster)
            cls.tenant = cls.cluster.tenant()
            for node in cls.cluster.nodes:
                if not wait_until(functools.partial(cls.registered, node.uuid), 60):
                    raise RuntimeError(f"agent {node.index} never registered")
            cls.set_up_cluster()
        except BaseException:
            cls._stop()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        cls._stop()
        super().tearDownClass()

    @classmethod
    def _stop(cls) -> None:
        try:
            if hasattr(cls, "tenant"):
                cls.run_async(cls.tenant.close())
            cls.loop.close()
        finally:
            cls.cluster.stop()
            shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def prepare(cls) -> None:
        """After the services started, before the agents do (e.g. the
        nodes' ``agent_options``)."""

    @classmethod
    def set_up_cluster(cls) -> None:
        """Once every agent registered: the class's own fixtures."""

    @classmethod
    def run_async(cls, coro: Coroutine[Any, Any, T]) -> T:
        return cls.loop.run_until_complete(coro)

    @staticmethod
    def kernel(node: NodeHandle) -> SoftKernel:
        assert node.kernel is not None
        return node.kernel

    @classmethod
    def registered(cls, uuid: str) -> bool:
        """The registrar has the node, its AK activated."""
        r = cls.http.call("GET", f"{cls.cluster.registrar_url}/v1/agents/{uuid}")
        return r.status_code == 200 and r.json()["activated"] is True

    def status(self, uuid: str) -> dict[str, Any]:
        """The tenant's view of a node."""
        return dict(self.run_async(self.tenant.status(uuid)))

    def wait_for(
        self,
        uuid: str,
        predicate: Callable[[dict[str, Any]], bool],
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """The node's status once ``predicate`` holds (or the timeout)."""
        wait_until(
            lambda: predicate(self.status(uuid)),
            self.wait_timeout if timeout is None else timeout,
        )
        return self.status(uuid)

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """``trusted-tenant ARGV`` with this deployment's tenant identity."""
        return subprocess.run(
            [script("trusted-tenant"), *argv],
            env=dict(os.environ, **self.cluster.tenant_env()),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
