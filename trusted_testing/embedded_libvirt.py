"""Real libvirt for tests and benchmarks: an embedded qemu driver in a
private root, and a tiny guest (Debian kernel + busybox initramfs).

``qemu:///embed?root=DIR`` runs libvirt's qemu driver inside this process
with every file under DIR (config, state, swtpm states in DIR/lib/swtpm,
logs), so tests never touch the machine's /etc/libvirt or a system daemon.
libvirt allows one embedded root per process. The process must run as root
and the ``libvirt-qemu`` user must exist (libvirt parses it before reading
qemu.conf); qemu and swtpm then run as root, logging to files (no virtlogd).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import libvirt

__all__ = ["EmbeddedLibvirt", "GuestImage", "domain_xml", "guest_image"]

_EVENT_LOOP: threading.Thread | None = None
_QEMU_CONF = """\
user = "root"
group = "root"
swtpm_user = "root"
swtpm_group = "root"
stdio_handler = "file"
"""
_CACHE = os.path.expanduser("~/.cache/trusted-cloud/vtpm-guest")
_INIT = """\
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t devtmpfs dev /dev
exec >/dev/ttyS0 2>&1
mount -t proc proc /proc
mount -t sysfs sys /sys
echo "VTPM-GUEST: up"
for dev in /dev/tpm0 /dev/tpmrm0; do
  [ -c "$dev" ] && echo "VTPM-GUEST: found $dev"
done
echo "VTPM-GUEST: tpm_version_major=$(cat /sys/class/tpm/tpm0/tpm_version_major)"
echo "VTPM-GUEST: done"
poweroff -f
"""


def _ensure_qemu_user() -> None:
    try:
        pwd.getpwnam("libvirt-qemu")
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--home-dir",
             "/var/lib/libvirt", "--shell", "/usr/sbin/nologin", "libvirt-qemu"],
            check=False,
        )  # fmt: skip


def _start_event_loop() -> None:
    global _EVENT_LOOP
    if _EVENT_LOOP is not None:
        return
    libvirt.virEventRegisterDefaultImpl()

    def run() -> None:
        while True:
            libvirt.virEventRunDefaultImpl()

    _EVENT_LOOP = threading.Thread(target=run, name="libvirt-events", daemon=True)
    _EVENT_LOOP.start()


class EmbeddedLibvirt:
    """libvirt's qemu driver embedded in this process, rooted in a temp dir.

    Everything it starts (qemu, swtpm) is killed by :meth:`close`, found by
    the root path in its command line.
    """

    def __init__(self, prefix: str = "vtpm-libvirt-") -> None:
        self.root = tempfile.mkdtemp(prefix=prefix)
        os.makedirs(os.path.join(self.root, "etc"))
        with open(os.path.join(self.root, "etc", "qemu.conf"), "w") as f:
            f.write(_QEMU_CONF)
        _ensure_qemu_user()
        _start_event_loop()
        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
        self.uri = f"qemu:///embed?root={self.root}"
        self.conn = libvirt.open(self.uri)
        # Secrets (Nova's vTPM passphrases) live in the embedded secret driver
        # that the qemu driver itself consults.
        self.secret_conn = libvirt.open(f"secret:///embed?root={self.root}")

    @property
    def swtpm_storage_dir(self) -> str:
        return os.path.join(self.root, "lib", "swtpm")

    def swtpm_pids(self) -> list[int]:
        """swtpm processes serving states under this root."""
        return self._pids("swtpm")

    def _pids(self, name: str) -> list[int]:
        found = []
        for path in glob.glob("/proc/[0-9]*/cmdline"):
            try:
                with open(path, "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if (
                argv
                and os.path.basename(argv[0].decode(errors="replace")) == name
                and any(self.root.encode() in a for a in argv)
            ):
                found.append(int(path.split("/")[2]))
        return found

    def close(self) -> None:
        with contextlib.suppress(libvirt.libvirtError):
            for dom in self.conn.listAllDomains():
                with contextlib.suppress(libvirt.libvirtError):
                    if dom.isActive():
                        dom.destroy()
                with contextlib.suppress(libvirt.libvirtError):
                    dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_TPM)
        with contextlib.suppress(libvirt.libvirtError):
            self.conn.close()
        with contextlib.suppress(libvirt.libvirtError):
            self.secret_conn.close()
        for name in ("qemu-system-x86_64", "swtpm"):
            for pid in self._pids(name):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


class GuestImage:
    """A kernel and an initramfs that print what TPM devices the guest has."""

    def __init__(self, kernel: str, initrd: str) -> None:
        self.kernel = kernel
        self.initrd = initrd


def _kernel_package() -> str:
    out = subprocess.run(
        ["apt-cache", "depends", "linux-image-amd64"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Depends: linux-image-"):
            return line.split()[1]
    raise RuntimeError("apt-cache knows no linux-image-amd64 dependency")


def guest_image(cache: str = _CACHE) -> GuestImage:
    """Build (once, cached) the tiny guest: the Debian kernel package's
    vmlinuz (downloaded with ``apt-get download``, never installed) and a
    busybox-static initramfs."""
    kernel = os.path.join(cache, "vmlinuz")
    initrd = os.path.join(cache, "initrd.cpio")
    if os.path.exists(kernel) and os.path.exists(initrd):
        return GuestImage(kernel, initrd)
    os.makedirs(cache, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        package = _kernel_package()
        debs = glob.glob(f"/var/cache/apt/archives/{package}_*.deb")
        if not debs:
            subprocess.run(
                ["apt-get", "download", "-q", package], cwd=tmp, check=True,
                stdout=subprocess.DEVNULL,
            )  # fmt: skip
            debs = glob.glob(os.path.join(tmp, f"{package}_*.deb"))
        tree = os.path.join(tmp, "deb")
        subprocess.run(["dpkg-deb", "-x", debs[0], tree], check=True)
        vmlinuz = glob.glob(os.path.join(tree, "boot", "vmlinuz-*"))[0]
        root = os.path.join(tmp, "initramfs")
        os.makedirs(os.path.join(root, "bin"))
        for d in ("dev", "proc", "sys"):
            os.makedirs(os.path.join(root, d))
        shutil.copy("/bin/busybox", os.path.join(root, "bin", "busybox"))
        with open(os.path.join(root, "init"), "w") as f:
            f.write(_INIT)
        os.chmod(os.path.join(root, "init"), 0o755)  # noqa: S103 (the guest's init)
        files = subprocess.run(
            ["find", "."], cwd=root, capture_output=True, check=True
        ).stdout
        cpio = subprocess.run(
            ["cpio", "-o", "-H", "newc", "--quiet"],
            cwd=root, input=files, capture_output=True, check=True,
        ).stdout  # fmt: skip
        with open(initrd + ".tmp", "wb") as f:
            f.write(cpio)
        shutil.copy(vmlinuz, kernel + ".tmp")
        os.replace(kernel + ".tmp", kernel)
        os.replace(initrd + ".tmp", initrd)
    return GuestImage(kernel, initrd)


def domain_xml(
    name: str,
    uuid: str,
    serial_log: str,
    image: GuestImage | None = None,
    memory_mib: int = 128,
    tpm: str = "",
) -> str:
    """A TCG q35 domain; with ``image`` it direct-boots the tiny guest.

    Args:
        tpm: raw ``<tpm>`` XML to include (e.g. a TPM 1.2 device for the
            bad-input tests), or empty.
    """
    boot = ""
    if image is not None:
        boot = (
            f"<kernel>{image.kernel}</kernel><initrd>{image.initrd}</initrd>"
            "<cmdline>console=ttyS0 no_timer_check panic=-1 quiet "
            "rdinit=/init</cmdline>"
        )
    return f"""<domain type='qemu'>
  <name>{name}</name><uuid>{uuid}</uuid>
  <memory unit='MiB'>{memory_mib}</memory><vcpu>1</vcpu>
  <os><type arch='x86_64' machine='q35'>hvm</type>{boot}</os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff><on_reboot>destroy</on_reboot>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <serial type='file'><source path='{serial_log}'/></serial>
    {tpm}
  </devices>
</domain>"""


def wait_for(predicate, timeout: float, step: float = 0.2):  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until truthy; its last value (falsy on timeout)."""
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(step)
        value = predicate()
    return value
