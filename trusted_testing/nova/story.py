"""The trusted-boot story through Nova's own libvirt driver: registrar and
verifier for agents in Nova-booted guests, Nova 34 on an emulated compute
host with a guest network, and the provider's part of each guest's
configuration.

:class:`NovaStory` brings up, in this order:

* a :class:`~trusted_testing.guest_vm_story.VmCluster` (registrar, verifier
  with a push endpoint, revocation hooks) whose certificate also names the
  guests' gateway;
* a :class:`~trusted_testing.nova.libvirt_deploy.LibvirtNovaDeployment`
  with a :class:`~trusted_testing.nova.guestnet.GuestNetwork`: the
  registrar and the push endpoint are forwarded to the gateway, each
  guest's agent port to a ``127.0.0.1`` port of the machine;
* ``trusted-nova-listener`` on Nova's bus with the ``vtpm`` hook (Nova's
  placements reach the registrar), and the compute host's swtpm local CA
  enrolled with ``trusted-vtpm-manager enrol-host``.

The provider's dynamic vendor-data (:meth:`NovaStory.vendordata`) gives the
agent what depends on the provider's network: the registrar as guests
reach it and, in pull mode, the contact address the verifier reaches the
agent at; in push mode (server metadata ``trusted_attestation=push``) the
verifier's push endpoint instead.

The measured-boot policy fits SeaBIOS, Nova's firmware here (UEFI needs
Secure Boot with libvirt 9.0, see
:meth:`~trusted_testing.nova.libvirt_deploy.LibvirtNovaDeployment.
add_guest_image`): SeaBIOS measures itself and its boot actions, not the
kernel qemu loads, so the policy allows no UEFI boot application and
requires Secure Boot off; the verifier still replays the whole log against
the quoted PCRs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

from trusted_testing.cluster import wait_until
from trusted_testing.guest_vm import VmImage
from trusted_testing.guest_vm_story import VmCluster, agent_settings_vendor_data
from trusted_testing.nova.guestnet import GuestNetwork
from trusted_testing.nova.libvirt_deploy import (
    DISK_GB,
    FLAVORS,
    RAM_MB,
    LibvirtNovaDeployment,
)
from trusted_testing.qga import GuestAgent, GuestAgentError
from verifier.ca import CertificateAuthority
from verifier.common import tls as tlsutil
from verifier.common.http import BlockingClient
from verifier.protocol.mb.policy import MeasuredBootPolicy
from vtpm_manager import cmd as vtpm_cmd
from vtpm_manager.swtpm_state import create_state

__all__ = ["PUSH_META", "LibvirtGuestAgent", "NovaStory", "seabios_mb_policy"]

#: Server metadata asking the provider for a push-mode agent.
PUSH_META = ("trusted_attestation", "push")


def seabios_mb_policy() -> dict[str, Any]:
    """The measured-boot policy of a SeaBIOS guest (see the module doc)."""
    return MeasuredBootPolicy(frozenset(), None, False).to_dict()


def _make_localca(localca: str, scratch: str) -> None:
    """A swtpm local CA in ``localca`` unless there is one (swtpm_localca
    makes it at its first EK certificate)."""
    if not os.path.exists(os.path.join(localca, "issuercert.pem")):
        state = os.path.join(scratch, "tpm2")
        create_state(state, localca, "instance-00000000:first-use")


class LibvirtGuestAgent(GuestAgent):
    """The guest's ``qemu-guest-agent`` through libvirt
    (``virsh qemu-agent-command``): libvirtd holds qemu's one connection
    to the agent's channel."""

    def __init__(self, uri: str, domain: str, timeout: float = 30.0) -> None:
        super().__init__(domain, timeout)
        self.uri = uri

    def call(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        message: dict[str, Any] = {"execute": command}
        if arguments is not None:
            message["arguments"] = arguments
        wait = max(1, int(self.timeout))
        try:
            done = subprocess.run(
                ["virsh", "-c", self.uri, "qemu-agent-command", "--timeout",
                 str(wait), self.path, json.dumps(message)],
                capture_output=True, text=True, timeout=wait + 60, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise GuestAgentError(f"{command}: virsh did not answer") from exc
        if done.returncode:
            raise GuestAgentError(f"{command}: {done.stderr.strip()[:300]}")
        try:
            reply = json.loads(done.stdout)
            return reply["return"]
        except (ValueError, KeyError, TypeError) as exc:
            raise GuestAgentError(f"{command}: {done.stdout[:300]!r}") from exc


class NovaStory:
    """Start with :meth:`start`, always :meth:`stop`."""

    def __init__(self, workdir: str, interval: float) -> None:
        self.workdir = workdir
        self.network = GuestNetwork()
        self.cluster = VmCluster(os.path.join(workdir, "cluster"), interval, push=True)
        self.cluster.server_names.append(self.network.gateway)
        os.makedirs(os.path.join(workdir, "nova"), exist_ok=True)
        self.nova = LibvirtNovaDeployment(os.path.join(workdir, "nova"), self.network)
        self.image_id = ""
        self.marks: dict[str, float] = {}

    def start(self, image: VmImage) -> None:
        begin = time.monotonic()
        self.cluster.prepare()
        pki = self.cluster.pki
        CertificateAuthority.load(pki).issue_to_files(
            pki, "vtpm-manager", ["127.0.0.1", "localhost"]
        )
        # the registrar's EK anchors: a CA of no Nova host (VMs outside
        # Nova); a Nova guest gets in only by its host's enrolled CA
        _make_localca(self.cluster.localca, os.path.join(self.workdir, "anchor"))
        self.cluster.start_services()
        self.nova.start()
        self.network.forward_in(self.cluster.registrar_port)
        assert self.cluster.push_port is not None
        self.network.forward_in(self.cluster.push_port)
        self.nova.standins.vendordata = self.vendordata
        # a resize on this one host goes to this flavor (a larger disk)
        self.nova.add_flavor(
            "trusted.vtpm-host-resized", FLAVORS["trusted.vtpm-host"], DISK_GB + 1
        )
        self.image_id = self.nova.add_guest_image(
            image.qcow2,
            image.kernel,
            image.initrd,
            image.cmdline,
            {"hw_qemu_guest_agent": "yes"},
        )
        self.cluster.start_nova_listener(
            self.nova.transport_url,
            hooks=["vtpm"],
            sections={"instance_hook_vtpm": self._provider_tls()},
        )
        if not wait_until(self._queue_declared, 120, 0.5):
            raise RuntimeError("trusted-nova-listener never declared its queue")
        self._enrol_host()
        self.marks["bring-up"] = time.monotonic() - begin

    def stop(self) -> None:
        try:
            self.cluster.stop()
        finally:
            self.nova.stop()

    # -- the provider ------------------------------------------------------

    def _provider_tls(self) -> dict[str, Any]:
        return {
            "registrar_url": self.cluster.registrar_url,
            "cert_file": self.cluster.pki_file("vtpm-manager.pem"),
            "key_file": self.cluster.pki_file("vtpm-manager-key.pem"),
            "ca_file": self.cluster.pki_file("ca.pem"),
        }

    def _queue_declared(self) -> bool:
        out = subprocess.run(
            ["rabbitmqctl", "-q", "list_queues", "-p", str(self.nova.vhost), "name"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
        return "trusted-cloud" in out

    def _enrol_host(self) -> None:
        """``trusted-vtpm-manager enrol-host`` for the compute host. The
        host's swtpm local CA is made first, as ``swtpm_localca`` makes it
        at a host's first vTPM (enrol-host only reads it)."""
        localca = self.nova.localca_dir
        _make_localca(localca, os.path.join(self.workdir, "host-ca"))
        localca_conf = os.path.join(self.workdir, "host-swtpm-localca.conf")
        with open(localca_conf, "w", encoding="utf-8") as f:
            f.write(f"statedir = {localca}\nissuercert = {localca}/issuercert.pem\n")
        conf = os.path.join(self.workdir, "vtpm-manager.conf")
        lines = [f"{k} = {v}" for k, v in self._provider_tls().items()]
        with open(conf, "w", encoding="utf-8") as f:
            f.write(
                "[vtpm_manager]\n" + "\n".join(lines) + "\nregistrar_retries = 1\n"
                f"host = {self.nova.host}\nlocalca_conf = {localca_conf}\n"
            )
        code = vtpm_cmd.main(["--config-file", conf, "enrol-host"])
        if code != 0:
            raise RuntimeError(f"trusted-vtpm-manager enrol-host exited {code}")

    def vendordata(self, body: Any) -> str:
        """Nova's dynamic vendor-data request -> the provider's part of the
        instance's cloud-config (see the module doc): Nova puts it in
        ``vendor_data2.json`` under the target's name, ``cloud-init``,
        where cloud-init takes it as vendor-data."""
        uuid = str(body.get("instance-id", ""))
        metadata = body.get("metadata") or {}
        gateway = self.network.gateway
        conf = f"[agent]\nregistrar_url = https://{gateway}:{self.cluster.registrar_port}\n"
        if metadata.get(PUSH_META[0]) == PUSH_META[1]:
            conf += (
                "attestation_mode = push\n"
                f"push_url = https://{gateway}:{self.cluster.push_port}\n"
            )
        else:
            contact = self.nova.contact_port(uuid)
            if contact is None:  # no port: the agent cannot be reached
                return ""
            conf += f"contact_host = 127.0.0.1\ncontact_port = {contact}\n"
        return agent_settings_vendor_data(conf)

    def placement(self, uuid: str) -> int:
        """The registrar's answer (HTTP status) for the instance's
        placement, asked as the provider (200: recorded, 404: none)."""
        tls = self._provider_tls()
        context = tlsutil.client_context(
            tls["cert_file"], tls["key_file"], tls["ca_file"]
        )
        answer = BlockingClient(context, 30.0).request(
            "GET", f"{self.cluster.registrar_url}/v1/provider/instances/{uuid}"
        )
        return int(answer.status)

    # -- the tenant ----------------------------------------------------------

    def guest_agent(self, uuid: str) -> LibvirtGuestAgent:
        return LibvirtGuestAgent(self.nova.libvirt_uri, uuid)

    def memory_mb(self) -> int:
        return RAM_MB
