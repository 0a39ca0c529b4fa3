"""Nova 34 with its real libvirt driver: :class:`LibvirtNovaDeployment`.

The same processes as :class:`~trusted_testing.nova.deploy.NovaDeployment`
(API, Placement, conductor, scheduler on a scratch RabbitMQ vhost), but
``nova-compute`` runs ``libvirt.LibvirtDriver`` (``virt_type = qemu``: TCG,
this machine has no KVM) against its own ``libvirtd``, both inside an
emulated compute host (:mod:`trusted_testing.nova.compute_host`: a private
mount namespace, its own swtpm local CA). Nova makes the vTPM itself:
``[libvirt] swtpm_enabled = True`` and flavors with ``hw:tpm_version=2.0``;
it keeps the vTPM's encryption secret in its key manager, castellan's
``vault`` backend on a real OpenBao server (:class:`OpenBaoDev`) — the
backend castellan ships for a server this project already runs in tests
(Barbican 23 would add a second WSGI service, its database and Keystone
auth to every run for the same castellan calls). Every instance gets a
config drive (``force_config_drive``; ISO 9660 made by ``xorrisofs``,
Debian has no genisoimage), which carries the user-data to cloud-init.

With a :class:`~trusted_testing.nova.guestnet.GuestNetwork`, guests get a
real NIC: the Neutron stand-in
(:class:`~trusted_testing.nova.neutron_standin.NeutronState`) hands out
ports of ``binding:vif_type`` ``tap``; Nova makes the tap (through its
privsep helper, run in the network namespace by ``nsenter``), libvirtd
(in the same namespace) gives it to qemu, and the namespace's bridge
carries the gateway. Every port gets a ``127.0.0.1`` port of the machine
forwarded to its agent port (:meth:`LibvirtNovaDeployment.contact_port`);
Nova's dynamic vendor-data (``DynamicJSON``, answered by the stand-in's
:attr:`~trusted_testing.nova.standins.StandIns.vendordata`) lets the
provider tell each guest how it is reached.

Glance stays the stand-in; :meth:`add_guest_image` serves the real guest
image (:mod:`trusted_testing.guest_vm`: a root-filesystem qcow2 booted
with its kernel and initramfs, as Glance ``kernel_id``/``ramdisk_id``/
``os_command_line`` images).
"""

from __future__ import annotations

import configparser
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

import requests

from trusted_testing.embedded_libvirt import _ensure_qemu_user
from trusted_testing.nova import images
from trusted_testing.nova.compute_hosts import (
    ComputeHost,
    shared_instances,
    unmount_shared,
)
from trusted_testing.nova.deploy import _BIN, PROJECT_ID, NovaDeployment
from trusted_testing.nova.guestnet import GuestNetwork
from trusted_testing.nova.neutron_standin import NeutronState
from trusted_testing.openbao import OpenBaoDev

__all__ = ["FLAVORS", "PLACEMENT_HEADERS", "LibvirtNovaDeployment"]

# name -> extra specs; all share RAM/vCPUs/disk (see _create_flavor)
FLAVORS: dict[str, dict[str, str]] = {
    "trusted.vtpm": {
        "hw:tpm_version": "2.0",
        "hw:tpm_model": "tpm-crb",
        "hw:tpm_secret_security": "user",
    },
    "trusted.vtpm-host": {
        "hw:tpm_version": "2.0",
        "hw:tpm_model": "tpm-crb",
        "hw:tpm_secret_security": "host",
    },
    "trusted.plain": {},
    # trusted compute pools: only on hosts whose provider has the trait
    "trusted.pool": {
        "hw:tpm_version": "2.0",
        "hw:tpm_model": "tpm-crb",
        "trait:CUSTOM_ATTESTATION_TRUSTED": "required",
    },
    "trusted.pool-host": {
        "hw:tpm_version": "2.0",
        "hw:tpm_model": "tpm-crb",
        "hw:tpm_secret_security": "host",
        "trait:CUSTOM_ATTESTATION_TRUSTED": "required",
    },
}
#: Placement's noauth2 admin (the deployment's Placement has no Keystone)
PLACEMENT_HEADERS = {
    "X-Auth-Token": "admin",
    "OpenStack-API-Version": "placement 1.39",
}
RAM_MB = 512
DISK_GB = 4
#: the agent's port in the guest (pull mode)
AGENT_PORT = 9002


def _update_ini(path: str, sections: dict[str, dict[str, Any]]) -> None:
    parser = configparser.RawConfigParser()
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(path, encoding="utf-8")
    for name, options in sections.items():
        if name != "DEFAULT" and not parser.has_section(name):
            parser.add_section(name)
        for key, value in options.items():
            parser.set(name, key, str(value))
    with open(path, "w", encoding="utf-8") as f:
        parser.write(f)


class LibvirtNovaDeployment(NovaDeployment):
    """Start with :meth:`start`, always :meth:`stop` (also after a failure).

    Args:
        workdir: where everything it writes lives.
        network: the guests' network (None: guests have no NIC).
        hosts: how many emulated compute hosts. Two or more share the
            instances directory through a cluster file system
            (:func:`~trusted_testing.nova.compute_hosts.shared_instances`),
            so guests can move between them.
        shutdown_timeout: Nova's ``[DEFAULT] shutdown_timeout`` if given
            (how long a guest is given to power off cleanly before a cold
            migration; a guest that boots no OS never does).
        localca_dirs: the swtpm local CA directory of each host, in order
            (None or missing: the host's own ``localca``).

    Attributes:
        hosts: the emulated compute hosts (:class:`~trusted_testing.nova.
            compute_hosts.ComputeHost`; the first is :attr:`host`), each
            with its resource provider once started.
        host_root: the first compute host's directory (its libvirt
            configuration, swtpm local CA, vTPM states, logs).
        bao: the key manager's server.
    """

    def __init__(
        self,
        workdir: str,
        network: GuestNetwork | None = None,
        hosts: int = 1,
        shutdown_timeout: int | None = None,
        localca_dirs: Sequence[str | None] = (),
    ) -> None:
        super().__init__(workdir)
        if hosts < 1:
            raise ValueError(f"a deployment needs a compute host, not {hosts}")
        self.host_root = os.path.join(workdir, "host")
        self.hosts = [
            ComputeHost(
                index=i,
                name=self.host if i == 0 else f"{self.host}-{chr(ord('a') + i)}",
                root=self.host_root if i == 0 else os.path.join(workdir, f"host-{i}"),
                conf=os.path.join(workdir, f"nova-compute-{i}.conf"),
                uts=hosts > 1,
                localca=localca_dirs[i] if i < len(localca_dirs) else None,
            )
            for i in range(hosts)
        ]
        self.bao = OpenBaoDev()
        self.network = network
        #: Neutron port ID -> the machine's 127.0.0.1 port forwarded to
        #: that port's agent port
        self.contact_ports: dict[str, int] = {}
        self._netns_mounted = False
        self._shared: str | None = None
        self.shutdown_timeout = shutdown_timeout

    @property
    def netns_file(self) -> str:
        """The guests' network namespace, where the compute host (whose
        /run is its own) sees it."""
        return os.path.join(self.host_root, "netns")

    def _start_network(self) -> None:
        network = self.network
        assert network is not None
        network.start()
        with open(self.netns_file, "w", encoding="ascii"):
            pass
        subprocess.run(
            ["mount", "--bind", network.path, self.netns_file], check=True, timeout=30
        )
        self._netns_mounted = True
        self.standins.neutron = NeutronState(
            PROJECT_ID,
            network.gateway,
            network.address,
            network.prefix,
            on_port=self._port_made,
        )

    def _port_made(self, port: Any) -> None:
        address = port["fixed_ips"][0]["ip_address"]
        assert self.network is not None
        self.contact_ports[port["id"]] = self.network.forward_out(address, AGENT_PORT)

    def instance_port(self, uuid: str) -> dict[str, Any] | None:
        """The Neutron port Nova bound to instance ``uuid``."""
        neutron = self.standins.neutron
        for port in neutron.ports() if neutron is not None else []:
            if port.get("device_id") == uuid:
                return port
        return None

    def contact_port(self, uuid: str) -> int | None:
        """The machine's 127.0.0.1 port forwarded to the agent port of
        instance ``uuid`` (None: it has no port)."""
        port = self.instance_port(uuid)
        return None if port is None else self.contact_ports[port["id"]]

    @property
    def libvirt_uri(self) -> str:
        """The first host's libvirtd."""
        return self.hosts[0].uri

    @property
    def localca_dir(self) -> str:
        """The first host's swtpm local CA (``swtpm_localca`` state)."""
        return self.hosts[0].localca_dir

    def compute_host_names(self) -> list[str]:
        return [host.name for host in self.hosts]

    def compute_host(self, name: str) -> ComputeHost:
        """The host whose ``[DEFAULT] host`` is ``name``."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    def start(self) -> None:
        _ensure_qemu_user()  # libvirtd parses it before reading qemu.conf
        for host in self.hosts:
            host.prepare(self.workdir)
        instances = os.path.join(self.workdir, "instances")
        os.makedirs(instances, exist_ok=True)
        self.bao.start()
        try:
            if len(self.hosts) > 1:
                self._shared = shared_instances(self.workdir, instances)
            if self.network is not None:
                self._start_network()
            super().start()
            self._find_providers()
        except BaseException:
            self.stop()
            raise

    def _find_providers(self) -> None:
        """Each host's compute node resource provider, from Placement (by
        the hypervisor host name Nova reports for that host)."""
        resp = self.request(
            "GET", "/os-hypervisors/detail", admin=True, microversion="2.53"
        )
        resp.raise_for_status()
        nodes = {
            h["service"]["host"]: h["hypervisor_hostname"]
            for h in resp.json()["hypervisors"]
        }
        deadline = time.monotonic() + 120
        for host in self.hosts:
            while not host.provider:
                resp = requests.get(
                    f"{self.placement_url}/resource_providers",
                    params={"name": nodes[host.name]},
                    headers=PLACEMENT_HEADERS,
                    timeout=30,
                )
                resp.raise_for_status()
                found = resp.json()["resource_providers"]
                if len(found) == 1:
                    host.provider = str(found[0]["uuid"])
                elif time.monotonic() > deadline:
                    raise RuntimeError(f"{host.name} has no resource provider")
                else:  # nova-compute reports its node, then its provider
                    time.sleep(0.5)

    def stop(self) -> None:
        try:
            self._destroy_domains()
        finally:
            pids = [pid for host in self.hosts for pid in self._vm_pids(host)]
            try:
                super().stop()
            finally:
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                self.bao.stop()
                self._stop_network()
                if self._shared is not None:
                    unmount_shared(self._shared)
                    self._shared = None

    def _stop_network(self) -> None:
        if self._netns_mounted:
            subprocess.run(["umount", self.netns_file], check=False, timeout=30)
            self._netns_mounted = False
        if self.network is not None:
            self.network.stop()

    def stop_key_manager(self) -> None:
        """Stop OpenBao (Nova's key manager becomes unreachable)."""
        self.bao.stop()

    def restart_key_manager(self) -> None:
        """A fresh OpenBao dev server where Nova expects its key manager
        (same port and token; the keys held before are gone)."""
        port, token = self.bao.port, self.bao.root_token
        self.bao = OpenBaoDev()
        self.bao.port, self.bao.root_token = port, token
        self.bao.url = f"http://127.0.0.1:{port}"
        self.bao.start()

    # -- configuration -----------------------------------------------------

    def _write_config(self) -> None:
        super()._write_config()
        helper = f"{os.path.join(_BIN, 'privsep-helper')} --config-file {self.conf}"
        _update_ini(
            self.conf,
            {
                "DEFAULT": {
                    "compute_driver": "libvirt.LibvirtDriver",
                    "force_config_drive": "true",
                    "mkisofs_cmd": "xorrisofs",
                    "force_raw_images": "false",
                    "allow_resize_to_same_host": "true",
                    "resume_guests_state_on_host_boot": "false",
                    # a busy 2-core machine may delay nova-compute's report:
                    # the API would then think it down and delete an
                    # instance "locally", leaving its domain running
                    "service_down_time": "300",
                    **(
                        {}
                        if self.shutdown_timeout is None
                        else {"shutdown_timeout": self.shutdown_timeout}
                    ),
                },
                "libvirt": {
                    "virt_type": "qemu",
                    "connection_uri": self.libvirt_uri,
                    "cpu_mode": "none",
                    "swtpm_enabled": "true",
                    "swtpm_user": "root",
                    "swtpm_group": "root",
                    "hw_machine_type": "x86_64=q35",
                },
                # nova-compute runs as root here: privsep's helper without
                # sudo and nova-rootwrap (not installed)
                "nova_sys_admin": {"helper_command": helper},
                "vif_plug_ovs_privileged": {"helper_command": helper},
                "vnc": {"enabled": "false"},
                "spice": {"enabled": "false"},
                "key_manager": {"backend": "vault"},
                "vault": {
                    "vault_url": self.bao.url,
                    "root_token_id": self.bao.root_token,
                    "use_ssl": "false",
                    "kv_mountpoint": "secret",
                    "kv_version": "2",
                },
            },
        )

        if self.network is not None:
            self._configure_network(helper)

    def _configure_network(self, helper: str) -> None:
        _update_ini(
            self.conf,
            {
                "DEFAULT": {
                    # the stand-in's ports are ACTIVE and no Neutron agent
                    # would send network-vif-plugged
                    "vif_plugging_is_fatal": "false",
                    "vif_plugging_timeout": "0",
                },
                # Nova's tap devices (plug_tap) in the guests' namespace,
                # where libvirtd opens them; with a sysfs of that namespace
                # (Nova tests /sys/class/net/<tap> before it makes a tap:
                # else a hard reboot, which keeps the tap, fails making it)
                "nova_sys_admin": {
                    "helper_command": (
                        f"nsenter --net={self.netns_file} unshare --mount "
                        "--propagation slave sh -c "
                        '\'mount -t sysfs sysfs /sys && exec "$0" "$@"\' '
                        f"{helper}"
                    )
                },
                "api": {
                    "vendordata_providers": "StaticJSON,DynamicJSON",
                    # vendor_data2.json = {"<name>": <answer>}; cloud-init
                    # takes the answer under the name "cloud-init"
                    "vendordata_dynamic_targets": (
                        f"cloud-init@{self.standins.url}/vendordata"
                    ),
                },
            },
        )

    def _start_computes(self) -> None:
        argv = self._service_argv("compute")
        netns = None if self.network is None else self.netns_file
        for host in self.hosts:
            _update_ini(host.conf, host.config(self.workdir))
            self._spawn(host.proc, host.wrap(argv, netns))

    def _create_flavor(self) -> None:
        super()._create_flavor()
        for name, specs in FLAVORS.items():
            self.add_flavor(name, specs)

    def add_flavor(
        self, name: str, specs: dict[str, str], disk_gb: int = DISK_GB
    ) -> str:
        """A flavor of :data:`RAM_MB` and one vCPU; returns its ID (the
        name with ``-`` for ``.``)."""
        body = {
            "flavor": {
                "name": name,
                "id": name.replace(".", "-"),
                "ram": RAM_MB,
                "vcpus": 1,
                "disk": disk_gb,
            }
        }
        resp = self.request("POST", "/flavors", admin=True, json=body)
        if resp.status_code != 200:
            raise RuntimeError(f"creating {name}: {resp.status_code} {resp.text}")
        if specs:
            resp = self.request(
                "POST",
                f"/flavors/{body['flavor']['id']}/os-extra_specs",
                admin=True,
                json={"extra_specs": specs},
            )
            if resp.status_code != 200:
                raise RuntimeError(
                    f"extra specs of {name}: {resp.status_code} {resp.text}"
                )
        return str(body["flavor"]["id"])

    # -- images ----------------------------------------------------------------

    def add_guest_image(
        self,
        qcow2: str,
        kernel: str,
        initrd: str,
        cmdline: str,
        properties: dict[str, str] | None = None,
    ) -> str:
        """Serve the guest image (:func:`~trusted_testing.nova.images.
        guest_image`); returns the root image's ID."""
        return images.guest_image(
            self.standins, qcow2, kernel, initrd, cmdline, properties
        )

    def add_blank_image(self, properties: dict[str, str] | None = None) -> str:
        """Serve a blank disk (:func:`~trusted_testing.nova.images.
        blank_image`); returns its ID."""
        path = os.path.join(self.workdir, "blank.qcow2")
        return images.blank_image(self.standins, path, properties)

    # -- the compute hosts ---------------------------------------------------------

    def _vm_pids(self, host: ComputeHost) -> list[int]:
        """Pids of qemu and swtpm processes ``host``'s libvirtd started."""
        proc = self.procs.get(host.proc)
        if proc is None or proc.poll() is not None:
            return []
        return host.vm_pids(proc.pid)

    def virsh(self, *argv: str) -> str:
        """Run ``virsh`` against the first host's libvirtd."""
        return self.hosts[0].virsh(*argv)

    def domain_xml(self, uuid: str) -> str:
        """The live XML of the instance's domain (libvirt uses Nova's UUID)."""
        return self.virsh("dumpxml", uuid)

    def _destroy_domains(self) -> None:
        for host in self.hosts:
            proc = self.procs.get(host.proc)
            if proc is not None and proc.poll() is None:
                host.destroy_domains()
