"""An emulated compute host: libvirtd and nova-compute in a private mount
namespace, so nothing they write outlives the test.

``unshare --mount --propagation private [--uts] python -m
trusted_testing.nova.compute_host ROOT [--hostname NAME] [--netns PATH] --
nova-compute ARGS...``

Inside the new mount namespace this module:

* mounts a tmpfs over ``/run``, ``/var/lib``, ``/var/log`` and
  ``/var/cache`` (libvirtd's runtime, state and log directories — the
  machine's own stay untouched and unseen);
* bind-mounts ``ROOT/etc-libvirt`` over ``/etc/libvirt`` (our
  ``libvirtd.conf`` and ``qemu.conf``, the secrets Nova defines, the
  ``hooks/qemu`` a test may install), ``ROOT/localca`` over
  ``/var/lib/swtpm-localca`` (this host's own swtpm local CA: the
  machine's ``/etc/swtpm-localca.conf`` points there, so every vTPM EK
  certificate this host's libvirt makes is signed by the CA of this host
  alone; ``--localca DIR`` binds another directory, e.g. an emulated
  host's whose kernel measures the CA file) and ``ROOT/swtpm`` over
  ``/var/lib/libvirt/swtpm`` (the vTPM states, readable by the test);
* starts ``libvirtd`` (its sockets in ``ROOT/sock``, so the test can reach
  it as ``qemu:///system?socket=ROOT/sock/libvirt-sock``) and waits for
  its socket;
* with ``--netns PATH``, runs libvirtd in that network namespace
  (:mod:`trusted_testing.nova.guestnet`: the guests' taps and addresses
  live there; nova-compute stays on the machine's loopback with the
  control plane);
* with ``--hostname NAME`` (under ``unshare --uts``), sets the host name
  libvirtd reports (Nova's hypervisor host name: the compute node's and
  its Placement resource provider's name);
* execs nova-compute, which sees the same files libvirtd sees (Nova
  reads and moves vTPM states under ``/var/lib/libvirt/swtpm`` on resize).

qemu and swtpm run as root, logging to files (no virtlogd); the libvirt
security drivers, cgroups and per-domain namespaces are off (a container
has none of them to spare).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable

_TMPFS = ("/run", "/var/lib", "/var/log", "/var/cache")
QEMU_CONF = """\
user = "root"
group = "root"
swtpm_user = "root"
swtpm_group = "root"
security_driver = "none"
cgroup_controllers = []
namespaces = []
stdio_handler = "file"
"""


def socket_path(root: str) -> str:
    """libvirtd's read-write socket of the host rooted at ``root``."""
    return os.path.join(root, "sock", "libvirt-sock")


def uri(root: str) -> str:
    """The libvirt URI of the host rooted at ``root``, from anywhere."""
    return f"qemu:///system?socket={socket_path(root)}"


def prepare(root: str, host_uuid: str | None = None) -> None:
    """Make ``root``'s directories and libvirt configuration (outside the
    namespace; idempotent). ``host_uuid``: libvirtd's host UUID (else the
    machine's: two hosts of one machine must differ for libvirt to migrate
    a guest between them)."""
    for sub in ("etc-libvirt/hooks", "localca", "swtpm", "sock", "log"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    with open(os.path.join(root, "etc-libvirt", "qemu.conf"), "w") as f:
        f.write(QEMU_CONF)
    with open(os.path.join(root, "etc-libvirt", "libvirtd.conf"), "w") as f:
        f.write(
            f'unix_sock_dir = "{os.path.join(root, "sock")}"\n'
            'unix_sock_rw_perms = "0700"\n'
            'auth_unix_rw = "none"\n'
            'auth_unix_ro = "none"\n'
            f'log_outputs = "3:file:{os.path.join(root, "log", "libvirtd.log")}"\n'
        )
        if host_uuid is not None:
            f.write(f'host_uuid = "{host_uuid}"\n')


def _mount(*argv: str) -> None:
    subprocess.run(["mount", *argv], check=True)


def _enter(root: str, localca: str) -> None:
    for path in _TMPFS:
        _mount("-t", "tmpfs", "-o", "mode=0755", "tmpfs", path)
    for path in (
        "/run/libvirt",
        "/var/lib/libvirt/swtpm",
        "/var/lib/swtpm-localca",
        "/var/log/libvirt/qemu",
        "/var/log/swtpm/libvirt/qemu",
        "/var/cache/libvirt",
    ):
        os.makedirs(path, exist_ok=True)
    _mount("--bind", os.path.join(root, "etc-libvirt"), "/etc/libvirt")
    _mount("--bind", localca, "/var/lib/swtpm-localca")
    _mount("--bind", os.path.join(root, "swtpm"), "/var/lib/libvirt/swtpm")


_CLONE_NEWNET = 0x40000000


def _enter_netns(fd: int) -> Callable[[], None]:
    """A ``preexec_fn`` that moves the child into the namespace ``fd``."""

    def enter() -> None:
        if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns")

    return enter


_USAGE = (
    "usage: compute_host ROOT [--hostname NAME] [--localca DIR] [--netns PATH]"
    " -- COMMAND..."
)


def main(argv: list[str]) -> int:
    options: dict[str, str] = {}
    while len(argv) > 2 and argv[1] in ("--hostname", "--localca", "--netns"):
        options[argv[1]] = argv[2]
        argv = [argv[0], *argv[3:]]
    if len(argv) < 3 or argv[1] != "--":
        print(_USAGE, file=sys.stderr)
        return 2
    if "--hostname" in options:
        socket.sethostname(options["--hostname"])
    netns_fd: int | None = None
    if "--netns" in options:
        # opened before /run is covered (ip netns keeps it in /run/netns)
        netns_fd = os.open(options["--netns"], os.O_RDONLY)
    root, command = os.path.abspath(argv[0]), argv[2:]
    _enter(root, options.get("--localca", os.path.join(root, "localca")))
    sock = socket_path(root)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock)
    libvirtd = subprocess.Popen(
        [shutil.which("libvirtd") or "/usr/sbin/libvirtd"],
        preexec_fn=None if netns_fd is None else _enter_netns(netns_fd),
    )
    if netns_fd is not None:
        os.close(netns_fd)
    deadline = time.monotonic() + 60
    while not os.path.exists(sock):
        if libvirtd.poll() is not None or time.monotonic() > deadline:
            print(f"libvirtd did not start ({libvirtd.returncode})", file=sys.stderr)
            return 1
        time.sleep(0.1)
    sys.stdout.flush()
    os.execv(command[0], command)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
