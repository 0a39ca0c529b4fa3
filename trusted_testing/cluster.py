"""A whole trusted-boot deployment on one machine, from real processes.

Used by ``make demo``, the end-to-end functional tests and the bootstrap
benchmark: an operator CA and mTLS certificates, the registrar and the
verifier as separate processes on SQLite, and N node agents, each with its
own swtpm process. Everything started here is stopped by PID.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid as uuid_mod
from collections.abc import Sequence
from typing import Any

from nova_plugin.exceptions import ServiceError
from nova_plugin.tenant import Tenant, TenantConfig
from trusted_testing.cluster_node import (
    GOLDEN_MEASUREMENT,
    PCR,
    ROOTKIT_MEASUREMENT,
    NodeHandle,
    expected_pcr,
    says,
    soft_kernel,
)
from trusted_testing.procs import (
    WaitTimeoutError,
    _write_conf,
    die_with_parent,
    wait_port,
    wait_until,
)
from trusted_testing.swtpm import Swtpm, ek_ca_bundle, free_port_pair, free_ports
from verifier.ca import CertificateAuthority
from verifier.common.tpm import Tpm

__all__ = [  # what tests and tools import from here
    "GOLDEN_MEASUREMENT",
    "PCR",
    "ROOTKIT_MEASUREMENT",
    "LocalCluster",
    "NodeHandle",
    "WaitTimeoutError",
    "die_with_parent",
    "expected_pcr",
    "free_port",
    "wait_port",
    "wait_until",
]


def free_port() -> int:
    """A free loopback port below the ephemeral range (see
    :func:`trusted_testing.swtpm.free_ports`)."""
    return free_ports(1)


def _script(name: str) -> str:
    return os.path.join(os.path.dirname(sys.executable), name)


class LocalCluster:
    """Registrar, verifier and ``nodes`` agents on swtpm, as real processes.

    Args:
        workdir: everything goes here (removed first).
        nodes: how many agents.
        interval: the verifier's quote interval (seconds).
        ak_alg: the agents' AK algorithm.
        notifiers: the verifier's notifier drivers.
        evidence: each node gets a soft firmware and kernel
            (:class:`SoftKernel`) writing a UEFI event log and an IMA list
            that its agent sends when the verifier asks.
        verifier_sections: more sections of the verifier's configuration
            (e.g. ``capabilities``).
        registrar_options: extra ``[registrar]`` options (e.g. the EK CA
            bundle of a compute host's vTPMs).
        registrar_sections: more sections of the registrar's configuration
            (e.g. ``keystone_authtoken``).
    """

    def __init__(
        self,
        workdir: str,
        nodes: int = 3,
        interval: float = 1.0,
        ak_alg: str = "ecc",
        notifiers: tuple[str, ...] = ("inprocess",),
        log_level: str = "INFO",
        verifier_options: dict[str, Any] | None = None,
        verifiers: int = 1,
        database_url: str | None = None,
        evidence: bool = False,
        verifier_sections: dict[str, dict[str, Any]] | None = None,
        registrar_options: dict[str, Any] | None = None,
        registrar_sections: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.workdir = os.path.abspath(workdir)
        self.registrar_sections = dict(registrar_sections or {})
        self.registrar_options = dict(registrar_options or {})
        self.n_nodes = nodes
        self.interval = interval
        self.ak_alg = ak_alg
        self.notifiers = list(notifiers)
        self.debug = log_level == "DEBUG"
        self.verifier_options = dict(verifier_options or {})
        self.verifier_sections = dict(verifier_sections or {})
        self.pki = os.path.join(self.workdir, "pki")
        #: subject alternative names of the services' certificates
        self.server_names = ["127.0.0.1", "localhost"]
        self.localca = os.path.join(self.workdir, "swtpm-localca")
        self.nodes: list[NodeHandle] = []
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.registrar_port = free_port()
        self.verifier_ports = [free_port() for _ in range(verifiers)]
        self.verifier_port = self.verifier_ports[0]
        # each verifier process binds its own [push] port: on one host two
        # processes cannot bind the same one (the second used to exit at
        # start, after its API port already answered)
        push_port = self.verifier_sections.get("push", {}).get("port")
        self.push_ports = (
            [push_port] + [free_port() for _ in range(verifiers - 1)]
            if push_port
            else []
        )
        self.database_url = database_url or f"sqlite:///{self.workdir}/verifier.sqlite"
        self.hook_record = os.path.join(self.workdir, "revocations.jsonl")
        self.evidence = evidence
        self.coordination_group = f"trusted-verifiers-{uuid_mod.uuid4().hex[:12]}"

    # -- set-up -------------------------------------------------------------

    def pki_file(self, name: str) -> str:
        return os.path.join(self.pki, name)

    @property
    def registrar_url(self) -> str:
        return f"https://127.0.0.1:{self.registrar_port}"

    @property
    def verifier_url(self) -> str:
        return f"https://127.0.0.1:{self.verifier_port}"

    @property
    def verifier_urls(self) -> list[str]:
        return [f"https://127.0.0.1:{port}" for port in self.verifier_ports]

    @staticmethod
    def verifier_name(index: int) -> str:
        return "verifier" if index == 0 else f"verifier{index + 1}"

    def tenant_env(self) -> dict[str, str]:
        return {
            "TRUSTED_REGISTRAR_URL": self.registrar_url,
            "TRUSTED_VERIFIER_URL": self.verifier_url,
            "TRUSTED_CERT": self.pki_file("tenant.pem"),
            "TRUSTED_KEY": self.pki_file("tenant-key.pem"),
            "TRUSTED_CA": self.pki_file("ca.pem"),
        }

    def tenant(self) -> Tenant:
        """A tenant client with this deployment's tenant certificate."""
        return Tenant(
            TenantConfig(
                self.registrar_url,
                self.verifier_url,
                self.pki_file("tenant.pem"),
                self.pki_file("tenant-key.pem"),
                self.pki_file("ca.pem"),
            )
        )

    def node_status(self, uuid: str) -> dict[str, Any] | None:
        """The verifier's view of a node (None: not enrolled), from a
        synchronous caller."""

        async def get() -> dict[str, Any] | None:
            tenant = self.tenant()
            try:
                return dict(await tenant.status(uuid))
            except ServiceError as exc:
                if exc.status == 404:
                    return None
                raise
            finally:
                await tenant.close()

        return asyncio.run(get())

    def _make_pki(self) -> None:
        ca = CertificateAuthority.create(self.pki, "Demo operator CA")
        for name in ("registrar", "verifier", "tenant", "agent", "operator"):
            ca.issue_to_files(self.pki, name, list(self.server_names))
        CertificateAuthority.create(
            os.path.join(self.workdir, "node-ca"), "Demo node identity CA"
        )

    def _spawn(self, name: str, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,  # noqa: PLW1509
            )
        self.procs[name] = proc
        return proc

    def start_services(self) -> None:
        atexit.register(self.stop)  # never leave processes behind
        if os.path.exists(self.workdir):
            shutil.rmtree(self.workdir)
        os.makedirs(self.workdir)
        self._make_pki()
        for i in range(self.n_nodes):
            self._prepare_node(i)
        if self.nodes:  # swtpm's local CA exists once a TPM was set up
            with open(os.path.join(self.workdir, "ek-ca.pem"), "wb") as f:
                f.write(ek_ca_bundle(self.localca))
        self._start_registrar()
        for index in range(len(self.verifier_ports)):
            self.start_verifier(index)

    def _prepare_node(self, i: int, uuid: str | None = None) -> None:
        node_dir = os.path.join(self.workdir, f"node{i + 1}")
        os.makedirs(node_dir)
        swtpm = Swtpm(os.path.join(node_dir, "tpm"), free_port_pair(), self.localca)
        uuid = uuid or str(uuid_mod.uuid4())
        node = NodeHandle(uuid, i + 1, node_dir, swtpm, free_port())
        self.nodes.append(node)  # so that stop() finds it whatever happens next
        swtpm.start()
        with Tpm(swtpm.tcti) as tpm:  # firmware measures the boot image
            tpm.pcr_extend(PCR, GOLDEN_MEASUREMENT)
        if self.evidence:
            node.kernel = soft_kernel(swtpm.tcti, node_dir)
            node.kernel.boot()

    def _common(self, name: str) -> dict[str, Any]:
        return {
            "debug": self.debug,
            "log_file": os.path.join(self.workdir, f"{name}.log"),
            "use_stderr": False,
        }

    def _ek_options(self) -> dict[str, Any]:
        if not self.nodes:  # emulated fleets have no EK certificates
            return {}
        return {
            "ek_ca_bundle": os.path.join(self.workdir, "ek-ca.pem"),
            "require_ek_certificate": True,
        }

    def _start_registrar(self) -> None:
        conf = os.path.join(self.workdir, "registrar.conf")
        _write_conf(
            conf,
            {
                "DEFAULT": self._common("registrar"),
                "registrar": {
                    "port": self.registrar_port,
                    "database_connection": f"sqlite:///{self.workdir}/registrar.sqlite",
                    "cert_file": self.pki_file("registrar.pem"),
                    "key_file": self.pki_file("registrar-key.pem"),
                    "ca_file": self.pki_file("ca.pem"),
                    **self._ek_options(),
                    # this harness attests no compute host: the host gate is
                    # off unless a test asks for it (registrar_options)
                    "host_trust": "off",
                    "verifier_clients": ",".join(
                        self.verifier_name(i) for i in range(len(self.verifier_ports))
                    ),
                    **self.registrar_options,
                },
                **self.registrar_sections,
            },
        )
        log = os.path.join(self.workdir, "registrar.out")
        proc = self._spawn(
            "registrar", [_script("trusted-registrar"), "--config-file", conf], log
        )
        wait_port(
            self.registrar_port, proc, os.path.join(self.workdir, "registrar.log")
        )

    def start_verifier(self, index: int = 0) -> None:
        """Start (or restart) verifier process ``index``."""
        name = self.verifier_name(index)
        conf = os.path.join(self.workdir, f"{name}.conf")
        sections = dict(self.verifier_sections)
        if self.push_ports:
            sections["push"] = {**sections["push"], "port": self.push_ports[index]}
        _write_conf(
            conf,
            {
                "DEFAULT": self._common(name),
                "verifier": {
                    "port": self.verifier_ports[index],
                    "database_connection": self.database_url,
                    "member_id": name,
                    # its own group: other clusters may share the backend
                    "coordination_group": self.coordination_group,
                    "cert_file": self.pki_file("verifier.pem"),
                    "key_file": self.pki_file("verifier-key.pem"),
                    "ca_file": self.pki_file("ca.pem"),
                    "registrar_url": self.registrar_url,
                    "quote_interval": self.interval,
                    "signing_key": os.path.join(self.workdir, "event-signing-key.pem"),
                    "ca_dir": os.path.join(self.workdir, "node-ca"),
                    "notifiers": self.notifiers,
                    "outbox_interval": 0.1,
                    **self.verifier_options,
                },
                "revocation_hooks": {"actions": ["log"], "retry_delay": 0.1},
                "action_log": {"record_file": self.hook_record},
                **sections,
            },
        )
        log = os.path.join(self.workdir, f"{name}.out")
        service_log = os.path.join(self.workdir, f"{name}.log")
        started = _count(service_log, LISTENING)  # a restart appends
        proc = self._spawn(
            name, [_script("trusted-verifier"), "--config-file", conf], log
        )
        wait_port(self.verifier_ports[index], proc, service_log)
        # its API port answers before its start-up ends (joining the group,
        # the push endpoint): wait for the end, or its exit, and say why
        wait_until(
            lambda: proc.poll() is not None or _count(service_log, LISTENING) > started,
            60,
            what=f"{name} started ({service_log})",
        )
        if proc.poll() is not None:
            with open(log, errors="replace") as f:
                tail = f.read()[-1500:]
            raise RuntimeError(f"{name} exited at start ({proc.returncode}):\n{tail}")

    def kill_verifier(self, index: int) -> None:
        """SIGKILL verifier ``index``: no clean shutdown, no group leave."""
        proc = self.procs[self.verifier_name(index)]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def _agent_options(self, node: NodeHandle) -> dict[str, Any]:
        options = {
            "uuid": node.uuid,
            "tcti": node.swtpm.tcti,
            "ak_alg": self.ak_alg,
            "port": node.port,
            "registrar_url": self.registrar_url,
            "ca_file": self.pki_file("ca.pem"),
            "cert_file": self.pki_file("agent.pem"),
            "key_file": self.pki_file("agent-key.pem"),
            "work_dir": node.work_dir,
            "tpm_shared": True,
            "ima_log_path": node.kernel.ima_path if node.kernel else "",
            "mb_log_path": node.kernel.mb_path if node.kernel else "",
            # never the test machine's own cloud-init files
            "bootstrap_file": "",
            "user_data_file": "",
            "instance_data_file": "",
            "instance_id_file": "",
        }
        options.update(node.agent_options)
        return {k: v for k, v in options.items() if v is not None}

    def start_agent(self, node: NodeHandle) -> None:
        conf = os.path.join(node.dir, "agent.conf")
        _write_conf(
            conf,
            {
                "DEFAULT": {
                    "debug": self.debug,
                    "log_file": node.log,
                    "use_stderr": False,
                },
                "agent": self._agent_options(node),
            },
        )
        node.proc = self._spawn(
            f"agent{node.index}",
            [_script("trusted-agent"), "--config-file", conf],
            os.path.join(node.dir, "agent.out"),
        )
        if _pushes(node.agent_options):
            # a push agent opens no port: wait for it to say so
            proc = node.proc
            wait_until(
                lambda: proc.poll() is not None or says(node.log, "opens no port"),
                60,
                what=f"push agent {node.index} started ({node.log})",
            )
            if proc.poll() is not None:
                raise RuntimeError(f"push agent {node.index} did not start: {node.log}")
            return
        wait_port(node.port, node.proc, node.log, timeout=60)

    def add_node(
        self, uuid: str, agent_options: dict[str, Any] | None = None
    ) -> NodeHandle:
        """A new agent on its own swtpm for node ``uuid`` (e.g. a Nova
        instance's), started after the services. The agent gets SIGTERM when
        the calling thread ends (PR_SET_PDEATHSIG): call it from a thread
        that outlives the agent. ``agent_options`` override the cluster's
        ``[agent]`` defaults (None drops one)."""
        self._prepare_node(len(self.nodes), uuid)
        node = self.nodes[-1]
        node.agent_options = dict(agent_options or {})
        self.start_agent(node)
        return node

    def start_nova_listener(
        self,
        transport_url: str,
        exchange: str = "nova",
        hooks: Sequence[str] = (),
        sections: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """``trusted-nova-listener`` on ``transport_url`` with the operator
        certificate (a provider-side service, stopped with the others);
        ``hooks`` and their option ``sections`` are added to its file."""
        conf = os.path.join(self.workdir, "nova-listener.conf")
        listener: dict[str, Any] = {
            "verifier_url": self.verifier_url,
            "cert_file": self.pki_file("operator.pem"),
            "key_file": self.pki_file("operator-key.pem"),
            "ca_file": self.pki_file("ca.pem"),
            "exchange": exchange,
        }
        if hooks:
            listener["hooks"] = ",".join(hooks)
        _write_conf(
            conf,
            {
                "DEFAULT": self._common("nova-listener"),
                "oslo_messaging_notifications": {"transport_url": transport_url},
                "nova_listener": listener,
                **(sections or {}),
            },
        )
        self._spawn(
            "nova-listener",
            [_script("trusted-nova-listener"), "--config-file", conf],
            os.path.join(self.workdir, "nova-listener.out"),
        )

    def start(self) -> None:
        self.start_services()
        for node in self.nodes:
            self.start_agent(node)

    def tamper(self, node: NodeHandle) -> None:
        """Something unexpected is measured on ``node`` (PCR 16 extended)."""
        with Tpm(node.swtpm.tcti) as tpm:
            tpm.pcr_extend(PCR, ROOTKIT_MEASUREMENT)

    def good_pcr_hex(self) -> str:
        return expected_pcr(GOLDEN_MEASUREMENT).hex()

    def hook_records(self) -> list[dict[str, Any]]:
        try:
            with open(self.hook_record, encoding="utf-8") as f:
                return [json.loads(line) for line in f if line.strip()]
        except OSError:
            return []

    # -- tear-down ----------------------------------------------------------

    def stop(self) -> None:
        procs = list(self.procs.values())
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for node in self.nodes:
            node.swtpm.stop()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: what a service logs once its start-up is over (verifier.cmd._service)
LISTENING = "Listening on https://"


def _count(path: str, line: str) -> int:
    """How many times ``line`` occurs in the log at ``path`` (0: no log)."""
    try:
        with open(path, errors="replace") as f:
            return f.read().count(line)
    except OSError:
        return 0


def _pushes(options: dict[str, Any]) -> bool:
    """Whether an agent with these options pushes (its mode, or a bootstrap
    file naming a push endpoint, as ``trusted-nova boot --mode push``
    writes)."""
    if options.get("attestation_mode") == "push":
        return True
    path = options.get("bootstrap_file")
    if not path or not os.path.exists(path):
        return False
    with open(path, "rb") as f:
        return b'"push_url"' in f.read()
