"""The emulated compute hosts of a :class:`~trusted_testing.nova.
libvirt_deploy.LibvirtNovaDeployment`: one :class:`ComputeHost` each.

Every host is a ``nova-compute`` with its own ``[DEFAULT] host``, its own
configuration file (read after the deployment's ``nova.conf``), its own
:mod:`~trusted_testing.nova.compute_host` root (libvirtd and its socket,
swtpm local CA, vTPM states, logs) and, with two hosts or more, its own
UTS host name (libvirt reports the machine's host name as the hypervisor
host name, which names the compute node and its Placement resource
provider: two hosts of one machine would claim one provider) and its own
``state_path`` (Nova keeps the compute node's UUID in
``state_path/compute_id``).

Hosts share the instances directory (as compute hosts sharing it over
NFS or a cluster file system do), so a cold migration moves no disk and
a live migration needs no block migration; libvirt migrates a guest
between two hosts through their own libvirtds (``live_migration_uri``
points at the destination's socket, tunnelled: qemu's own migration
listener would need an address that is not loopback). libvirt refuses
to live-migrate a guest whose disk is on a local file system ("Unsafe
migration: Migration without shared storage is unsafe"; it tells by the
file system type, and one machine's ext4 is local), so with two hosts or
more the shared directory is a FUSE mount of type ``fuse.glusterfs``
(``bindfs``, passing through to a directory of the machine), which
libvirt 9.0 takes for GlusterFS: the cluster file system a real pair of
compute hosts would share.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import subprocess
import sys
import uuid as uuid_mod

from trusted_testing.nova import compute_host

__all__ = ["ComputeHost", "live_socket_dir", "shared_instances", "unmount_shared"]


def shared_instances(workdir: str, mountpoint: str) -> str:
    """Mount ``workdir/instances-store`` at ``mountpoint`` as a file system
    libvirt takes for a cluster one; returns the mount point."""
    store = os.path.join(workdir, "instances-store")
    os.makedirs(store, exist_ok=True)
    subprocess.run(
        ["bindfs", "-o", "subtype=glusterfs,fsname=trusted-shared", store, mountpoint],
        check=True,
        timeout=60,
    )
    return mountpoint


def unmount_shared(mountpoint: str) -> None:
    """Undo :func:`shared_instances` (lazily: a process may still hold a
    file open)."""
    subprocess.run(["umount", "-l", mountpoint], check=False, timeout=60)


def live_socket_dir(workdir: str) -> str:
    """Where each host's libvirtd socket directory is linked by host name
    (``live_migration_uri`` names the destination by its Nova host)."""
    return os.path.join(workdir, "live")


@dataclasses.dataclass
class ComputeHost:
    """One emulated compute host.

    Attributes:
        index: 0 for the first host (the deployment's ``host``).
        name: its ``[DEFAULT] host``, also its hypervisor host name and
            the name of its Placement resource provider when the
            deployment has several hosts.
        root: its :mod:`~trusted_testing.nova.compute_host` directory.
        conf: its own configuration file.
        uts: whether it runs under its own UTS host name.
        localca: its swtpm local CA directory if not ``root/localca``
            (e.g. the one of a :class:`trusted_testing.hosttpm.
            EmulatedHost`, whose kernel measures the CA file).
        provider: its compute node's resource provider UUID (set once
            nova-compute has reported to Placement).
    """

    index: int
    name: str
    root: str
    conf: str
    uts: bool
    localca: str | None = None
    provider: str = ""

    @property
    def proc(self) -> str:
        """Its nova-compute's name among the deployment's processes."""
        return "nova-compute" if self.index == 0 else f"nova-compute-{self.index}"

    @property
    def uri(self) -> str:
        """Its libvirtd, from anywhere on the machine."""
        return compute_host.uri(self.root)

    @property
    def localca_dir(self) -> str:
        """Its swtpm local CA (``swtpm_localca`` state)."""
        return self.localca or os.path.join(self.root, "localca")

    def prepare(self, workdir: str) -> None:
        """Its directories, libvirt configuration and the link
        ``live_migration_uri`` reaches its libvirtd through."""
        # libvirt refuses to migrate between two hosts of one host UUID
        host_uuid = str(uuid_mod.uuid5(uuid_mod.NAMESPACE_DNS, self.name))
        compute_host.prepare(self.root, host_uuid=host_uuid)
        os.makedirs(os.path.join(self.root, "state"), exist_ok=True)
        os.makedirs(self.localca_dir, exist_ok=True)
        links = live_socket_dir(workdir)
        os.makedirs(links, exist_ok=True)
        link = os.path.join(links, self.name)
        if not os.path.islink(link):
            os.symlink(os.path.join(self.root, "sock"), link)

    def config(self, workdir: str) -> dict[str, dict[str, str]]:
        """Its own configuration sections (over the shared ``nova.conf``)."""
        default = {"host": self.name}
        if self.uts:
            default["state_path"] = os.path.join(self.root, "state")
        socket = os.path.join(live_socket_dir(workdir), "%s", "libvirt-sock")
        return {
            "DEFAULT": default,
            "libvirt": {
                "connection_uri": self.uri,
                "live_migration_uri": f"qemu+unix:///system?socket={socket}",
                "live_migration_tunnelled": "true",
            },
        }

    def wrap(self, argv: list[str], netns: str | None) -> list[str]:
        """``argv`` (nova-compute) run inside this host."""
        flags = ["--mount", "--propagation", "private"]
        options = []
        if self.uts:
            flags.append("--uts")
            options += ["--hostname", self.name]
        if self.localca is not None:
            options += ["--localca", self.localca]
        if netns is not None:
            options += ["--netns", netns]
        return [
            "unshare",
            *flags,
            sys.executable,
            compute_host.__file__,
            self.root,
            *options,
            "--",
            *argv,
            "--config-file",
            self.conf,
        ]

    # -- what runs on it --------------------------------------------------------

    def vm_pids(self, compute_pid: int) -> list[int]:
        """Pids of qemu and swtpm processes this host's libvirtd started
        (their pid files live in the host's private /run)."""
        pids = []
        run = f"/proc/{compute_pid}/root/run/libvirt/qemu"
        for path in glob.glob(f"{run}/*.pid") + glob.glob(f"{run}/swtpm/*.pid"):
            try:
                with open(path, encoding="ascii") as f:
                    pids.append(int(f.read().strip()))
            except (OSError, ValueError):
                continue
        return pids

    def virsh(self, *argv: str) -> str:
        """Run ``virsh`` against this host's libvirtd."""
        out = subprocess.run(
            ["virsh", "-c", self.uri, *argv],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return out.stdout

    def domains(self) -> list[str]:
        """The names of the domains running here."""
        return self.virsh("list", "--name").split()

    def domain_uuids(self) -> list[str]:
        """The UUIDs of the domains running here (Nova's instance UUIDs)."""
        return self.virsh("list", "--uuid").split()

    def destroy_domains(self) -> None:
        """Stop every domain running here (best effort)."""
        try:
            names = self.domains()
        except (subprocess.SubprocessError, OSError):
            return
        for name in names:
            subprocess.run(
                ["virsh", "-c", self.uri, "destroy", name],
                capture_output=True,
                timeout=60,
                check=False,
            )
