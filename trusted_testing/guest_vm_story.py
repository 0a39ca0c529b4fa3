"""The trusted-boot story in a real guest: the services on the host, the
operator's guest image (:mod:`trusted_testing.guest_vm`) booted under qemu
with a vTPM whose EK certificate a swtpm local CA signed, as Nova and
libvirt make it.

The guest gets what ``trusted-nova boot`` puts into a Nova instance's
user-data (the bootstrap file and the sealed payload) and, as vendor-data,
what a provider adds: nothing else, no operator certificate. The agent
registers anonymously, identified by its vTPM's EK certificate.

The network is qemu's user networking only. The guest reaches the
registrar at ``https://10.0.2.2:PORT`` (slirp's address of the host's
127.0.0.1; the registrar's certificate names it), and the verifier and the
tenant reach the agent at ``127.0.0.1:P``, a port qemu forwards to the
guest's 9002; the vendor-data's ``agent.conf.d`` file makes the agent
register that address as its contact. In push mode (``VmCluster(push=
True)``) nothing is forwarded to the guest: the vendor-data sets the agent
to push to the verifier's push endpoint at ``https://10.0.2.2:PUSH``, and
the tenant reaches the agent only through the verifier's relay.

The policies are built from the image, as a tenant would
(:mod:`nova_plugin.policygen`): the runtime policy from the image's tar
and initramfs plus the payload, the measured-boot policy from its kernel
as qemu loads it.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from nova_plugin.boot import prepare_user_data
from nova_plugin.policygen import (
    DEFAULT_EXCLUDES,
    measured_boot_policy,
    qemu_direct_boot_kernel,
    runtime_policy,
)
from nova_plugin.tenant import Tenant
from trusted_testing.cluster import LocalCluster
from trusted_testing.guest_vm import VmImage
from trusted_testing.guest_vm_boot import (
    AGENT_PORT,
    CLOUD_INIT_DONE,
    Firmware,
    VmGuest,
)
from trusted_testing.swtpm import ek_ca_bundle, free_ports
from verifier.common.imagefiles import cpio_files, tar_files
from verifier.protocol import PcrPolicy, split
from verifier.protocol.attestation import AttestationMode
from verifier.protocol.enroller import commit_u
from verifier.protocol.events import (
    NODE_FAILED,
    NODE_RECOVERED,
    NODE_REVOKED,
    NODE_UNREACHABLE,
)
from verifier.protocol.messages.enrolment import EnrolmentRequest
from verifier.protocol.messages.registration import RegistrationRecord

__all__ = [
    "AWAY_AND_BACK",
    "CUT_OFF",
    "GUEST_HOST",
    "IMA_LIST",
    "MB_LOG",
    "PAYLOAD_DIR",
    "Seed",
    "StoryNode",
    "agent_settings_vendor_data",
    "VmCluster",
    "image_policies",
    "run_async",
    "trusted_nova_seed",
]

#: The host's 127.0.0.1 as the guest sees it on qemu's user network.
GUEST_HOST = "10.0.2.2"
IMA_LIST = "/sys/kernel/security/ima/ascii_runtime_measurements"
MB_LOG = "/sys/kernel/security/tpm0/binary_bios_measurements"
#: The provider's vendor-data drops the agent's contact address here.
CONTACT_CONF = "/etc/trusted-cloud/agent.conf.d/50-contact.conf"
PAYLOAD_DIR = "/var/lib/trusted-cloud-agent"
#: The events whose hooks cut a node off (the revocation actions run).
CUT_OFF = frozenset({NODE_REVOKED, NODE_FAILED})
#: What an agent restart or a reboot leaves in a node's history.
AWAY_AND_BACK = [NODE_UNREACHABLE, NODE_RECOVERED]


def run_async(work: Callable[[Tenant], Any], cluster: LocalCluster) -> Any:
    """Run ``await work(tenant)`` with a fresh tenant client."""

    async def main() -> Any:
        tenant = cluster.tenant()
        try:
            return await work(tenant)
        finally:
            await tenant.close()

    return asyncio.run(main())


def _hold(port: int) -> socket.socket:
    """A socket bound to ``port`` on 127.0.0.1 (not listening): another
    bind of the port fails until it is closed."""
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        held.bind(("127.0.0.1", port))
    except OSError:  # taken since it was probed: the service will say so
        pass
    return held


class VmCluster(LocalCluster):
    """Registrar and verifier for agents in VMs (no agents of its own).

    The registrar trusts the EK certificates of ``localca`` (the compute
    host's swtpm local CA), and its certificate also names
    :data:`GUEST_HOST`. Call :meth:`prepare` (PKI) before the guest starts
    (its vTPM is made with the local CA), then :meth:`start_services`.
    """

    def __init__(self, workdir: str, interval: float = 2.0, push: bool = False) -> None:
        #: the verifier's push endpoint port (push mode), else None
        self.push_port = free_ports(1) if push else None
        sections = {"push": {"port": self.push_port}} if push else {}
        super().__init__(
            workdir,
            nodes=0,
            interval=interval,
            verifier_sections=sections,
            # No tolerance added for slow guests: a reboot on TCG leaves the
            # agent unanswering for up to ~3 min, so the node is unreachable
            # meanwhile (a signed node.unreachable event, the hooks'
            # unreachable_actions: log), never revoked ([verifier]
            # unreachable_timeout is 15 min), and a good quote of the new
            # boot brings it back (node.recovered). The life tests see that.
            registrar_options={
                "ek_ca_bundle": os.path.join(os.path.abspath(workdir), "ek-ca.pem"),
                "require_ek_certificate": True,
            },
        )
        self.server_names.append(GUEST_HOST)
        # The services start only after the guest boots (minutes on TCG):
        # until then their ports are held, so that the other test worker's
        # random port probes (verifier.common.swtpm_localca.free_ports) cannot pick
        # one of them meanwhile ("[push] port ...: Address already in use").
        ports = [self.registrar_port, *self.verifier_ports, *self.push_ports]
        self._held = [_hold(port) for port in ports]

    @property
    def guest_registrar_url(self) -> str:
        """The registrar as the guest reaches it."""
        return f"https://{GUEST_HOST}:{self.registrar_port}"

    @property
    def guest_push_url(self) -> str:
        """The verifier's push endpoint as the guest reaches it."""
        return f"https://{GUEST_HOST}:{self.push_port}"

    def prepare(self) -> None:
        """A fresh work directory and the operator's PKI."""
        atexit.register(self.stop)
        if os.path.exists(self.workdir):
            shutil.rmtree(self.workdir)
        os.makedirs(self.workdir)
        self._make_pki()

    def start_services(self) -> None:
        """The registrar (EK anchors: the local CA) and the verifier."""
        with open(os.path.join(self.workdir, "ek-ca.pem"), "wb") as out:
            out.write(ek_ca_bundle(self.localca))
        for held in self._held:  # the services take their ports now
            held.close()
        self._held = []
        self._start_registrar()
        for index in range(len(self.verifier_ports)):
            self.start_verifier(index)

    def ca_pem(self) -> str:
        """The operator CA certificate (the guest authenticates the
        registrar and its callers with it)."""
        with open(self.pki_file("ca.pem"), encoding="utf-8") as handle:
            return handle.read()

    def wait_node(
        self, uuid: str, states: tuple[str, ...], timeout: float
    ) -> Mapping[str, Any]:
        """Poll the verifier until node ``uuid`` is in one of ``states``.

        Raises:
            AssertionError: not within ``timeout`` seconds (with its status).
        """
        deadline = time.monotonic() + timeout
        status: Mapping[str, Any] | None = None
        while time.monotonic() < deadline:
            status = self.node_status(uuid)
            if status is not None and status["state"] in states:
                return status
            time.sleep(1.0)
        raise AssertionError(f"node {uuid} not {states} in {timeout:.0f}s: {status}")

    def event_types(self, uuid: str) -> list[str]:
        """The types of node ``uuid``'s signed events, oldest first."""
        events = run_async(lambda t: t.events(uuid), self)
        return [str(e["signed_event"]["event"]["type"]) for e in events]

    def hook_types(self, uuid: str) -> list[str]:
        """The event types the hooks' log action recorded for ``uuid``."""
        return [str(r["type"]) for r in self.hook_records() if r["node_uuid"] == uuid]

    def wait_hooks(
        self, uuid: str, timeout: float, types: frozenset[str] = CUT_OFF
    ) -> list[dict[str, Any]]:
        """The hooks' records of node ``uuid`` for events of ``types`` (by
        default those that run the revocation actions), once there are any
        (empty after ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            found = [
                r
                for r in self.hook_records()
                if r["node_uuid"] == uuid and r["type"] in types
            ]
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.5)


@dataclasses.dataclass(frozen=True)
class Seed:
    """What the tenant and the provider put into the VM's NoCloud seed.

    Attributes:
        user_data: ``trusted-nova boot``'s user-data: the bootstrap
            configuration (the registrar as the guest reaches it, the
            operator CA, the boot id) and the sealed payload.
        vendor_data: the provider's part: the agent's contact address
            behind qemu's port forward (``agent.conf.d``).
        key: the payload key K the tenant keeps (split into U and V).
    """

    user_data: bytes
    vendor_data: str
    key: bytes


def trusted_nova_seed(
    cluster: VmCluster, payload: bytes, contact_port: int | None
) -> Seed:
    """The user-data of ``trusted-nova boot`` for ``payload`` and the
    vendor-data of a provider whose VMs are reached through a forwarded
    port of the host's 127.0.0.1 -- or, ``contact_port`` None, of one
    whose VMs are not reached at all: their agents push to the verifier's
    push endpoint."""
    key, _sealed, _boot_id, user_data = prepare_user_data(
        payload, cluster.guest_registrar_url, cluster.ca_pem()
    )
    if contact_port is None:
        conf = (
            f"[agent]\nattestation_mode = push\npush_url = {cluster.guest_push_url}\n"
        )
    else:
        conf = f"[agent]\ncontact_host = 127.0.0.1\ncontact_port = {contact_port}\n"
    return Seed(user_data, agent_settings_vendor_data(conf), key)


def agent_settings_vendor_data(conf: str) -> str:
    """A provider's vendor-data (cloud-config) that drops ``conf`` into the
    agent's ``agent.conf.d`` at every boot."""
    # Not write_files: cloud-init lets the user-data's write_files (the
    # bootstrap file) replace the vendor-data's. bootcmd runs from a file
    # on /run (tmpfs: IMA's tcb policy does not measure it) at each boot.
    script = 'mkdir -p "${0%/*}" && printf %s "$1" > "$0"'
    bootcmd = [["/bin/sh", "-c", script, CONTACT_CONF, conf]]
    return "#cloud-config\n" + json.dumps({"bootcmd": bootcmd}, indent=1) + "\n"


def image_policies(
    image: VmImage,
    payload: bytes,
    name: str,
    memory_mb: int,
    excludes: tuple[str, ...] = (),
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The runtime and measured-boot policies of ``image`` (JSON forms), as
    ``trusted-tenant policy generate`` builds them: the root's tar and the
    initramfs plus the payload; the kernel as qemu loads it for a VM of
    ``memory_mb``, Secure Boot off, firmware not checked."""
    files = [*tar_files(image.tar), *cpio_files(image.initrd)]
    runtime = runtime_policy(
        files, name, 1, excludes=(*DEFAULT_EXCLUDES, *excludes), payloads=[payload]
    )
    with open(image.kernel, "rb") as handle:
        kernel = handle.read()
    loaded = qemu_direct_boot_kernel(kernel, os.path.getsize(image.initrd), memory_mb)
    mb = measured_boot_policy(loaded, None, False)
    return runtime.to_dict(), mb.to_dict()


class StoryNode:
    """One VM through the tenant's trusted boot (see the module doc).

    Attributes:
        guest: The running VM.
        uuid: Its instance UUID (the node).
        contact_port: The host port forwarded to the agent's 9002.
        record: The registrar's record, once registered.
        runtime_policy: The runtime policy (JSON form) built from the image.
        mb_policy: The measured-boot policy (JSON form).
        marks: Seconds after qemu started at which each stage was seen.
    """

    def __init__(
        self,
        cluster: VmCluster,
        guest: VmGuest,
        uuid: str,
        payload: bytes,
        key: bytes,
    ) -> None:
        self.cluster = cluster
        self.guest = guest
        self.uuid = uuid
        self.payload = payload
        self.key = key
        #: None in push mode: nothing is forwarded to the guest
        self.contact_port = guest.ports.get(AGENT_PORT)
        self.mode = "push" if cluster.push_port is not None else "pull"
        self.record: RegistrationRecord | None = None
        self.runtime_policy: dict[str, Any] = {}
        self.mb_policy: dict[str, Any] = {}
        self.marks: dict[str, float] = {}

    @classmethod
    def boot(
        cls,
        cluster: VmCluster,
        image: VmImage,
        uuid: str,
        payload: bytes,
        allow_reboot: bool = False,
        policy_name: str = "image",
        firmware: Firmware | None = None,
        mb_policy: dict[str, Any] | None = None,
    ) -> StoryNode:
        """Start the VM (``cluster`` prepared), then the services. A push
        cluster's VM gets no forwarded port at all. The runtime policy built
        from the image is named ``policy_name``. ``firmware``: boot the
        image's disk under that UEFI firmware (a whole-disk image);
        ``mb_policy``: the measured-boot policy instead of the direct-boot
        kernel's."""
        contact = None if cluster.push_port is not None else free_ports(1)
        seed = trusted_nova_seed(cluster, payload, contact)
        guest = VmGuest(
            image,
            seed.user_data,
            vendor_data=seed.vendor_data,
            instance_id=uuid,
            forward={} if contact is None else {AGENT_PORT: contact},
            localca_dir=cluster.localca,
            allow_reboot=allow_reboot,
            firmware=firmware,
        )
        guest.start()
        node = cls(cluster, guest, uuid, payload, seed.key)
        try:
            cluster.start_services()
            node.runtime_policy, node.mb_policy = image_policies(
                image, payload, policy_name, guest.memory_mb
            )
            if mb_policy is not None:
                node.mb_policy = mb_policy
        except BaseException:
            guest.stop()
            raise
        return node

    def mark(self, stage: str) -> None:
        self.marks[stage] = self.guest.elapsed()

    def _see_cloud_init(self) -> None:
        if "cloud-init done" not in self.marks:
            found = CLOUD_INIT_DONE.search(self.guest.console())
            if found is not None:
                self.mark("cloud-init done")
                self.marks["cloud-init done (guest uptime)"] = float(found.group(1))

    def wait_registered(self, timeout: float) -> RegistrationRecord:
        """Poll the registrar until the agent activated its AK."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._see_cloud_init()
            record = run_async(lambda t: t.activated_record(self.uuid), self.cluster)
            if isinstance(record, RegistrationRecord):
                self.record = record
                self._see_cloud_init()
                self.mark("agent registered")
                return record
            time.sleep(1.0)
        raise AssertionError(
            f"the agent did not register in {timeout:.0f}s\n"
            + self.guest.console()[-3000:]
        )

    def enrol(
        self,
        runtime_ref: str | None = None,
        mb_ref: str = "image-mb",
        runtime: bool = True,
    ) -> None:
        """The tenant stores its policies (the runtime policy under its name,
        ``image`` unless :meth:`boot` said otherwise; ``image-mb``) and enrols
        the node with ``runtime_ref`` (default: that name) and ``mb_ref`` (a
        bare name follows the newest version, ``NAME@VERSION`` pins): V to the
        verifier, the identity quote through its relay, U alone to the agent
        (it has the sealed payload from its user-data). ``runtime=False``:
        no runtime policy at all (measured boot and PCRs only)."""

        async def enrol(tenant: Tenant) -> None:
            name = str(self.runtime_policy["name"])
            if runtime:
                await tenant.add_policy("runtime", self.runtime_policy, name)
            await tenant.add_policy("measured-boot", self.mb_policy, "image-mb")
            record = await tenant.identity(self.uuid)
            policy, mode = PcrPolicy({}), AttestationMode(self.mode)
            u_share, v_share = split(self.key)
            request = EnrolmentRequest(
                self.uuid,
                v_share,
                policy,
                (runtime_ref or name) if runtime else None,
                mb_ref,
                mode=mode,
                u_commitment=commit_u(self.uuid, u_share),
            )
            await tenant.request(
                "POST", f"{tenant.verifier_url}/v1/nodes", request.to_dict()
            )
            # through the verifier's relay (either mode): once enrolled
            nk = await tenant.check_identity_quote(self.uuid, record, policy, mode)
            # U alone: the agent has the sealed payload from its user-data.
            await tenant.send_u(self.uuid, record, nk, u_share, None, mode=mode)

        run_async(enrol, self.cluster)
        self.mark("enrolled")

    def wait_attested(self, timeout: float) -> Mapping[str, Any]:
        """The node's status once the verifier decided (attested or not)."""
        states = ("attested", "revoked", "failed", "unreachable")
        status = self.cluster.wait_node(self.uuid, states, timeout)
        self.mark(str(status["state"]))
        return status

    def bootstrap(
        self, timeout: float, runtime_ref: str | None = None, runtime: bool = True
    ) -> None:
        """:meth:`wait_registered`, :meth:`enrol` (with ``runtime_ref`` and
        ``runtime``), :meth:`wait_attested` and :meth:`wait_payload`.

        Raises:
            AssertionError: a step failed or did not end in ``timeout`` s.
        """
        self.wait_registered(timeout)
        self.enrol(runtime_ref, runtime=runtime)
        status = self.wait_attested(timeout)
        if status["state"] != "attested":
            raise AssertionError(f"the node was not attested: {status}")
        self.wait_payload(timeout)

    def wait_payload(self, timeout: float) -> bytes:
        """The payload's status file, once the agent wrote it."""
        self.guest.agent.wait_ready(timeout)
        deadline = time.monotonic() + timeout
        while True:
            done = self.guest.agent.exec(["/bin/cat", PAYLOAD_DIR + "/payload.status"])
            if done.exit_code == 0:
                self.mark("payload ran")
                return done.stdout
            if time.monotonic() > deadline:
                raise AssertionError(f"the payload did not run: {done.stderr!r}")
            time.sleep(1.0)
