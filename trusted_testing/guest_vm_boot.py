"""Boot the operator's guest image (:mod:`trusted_testing.guest_vm`) under
qemu with OVMF, a swtpm vTPM and a NoCloud seed, and read its serial console.

The boot is what Nova does for an image with ``kernel_id``, ``ramdisk_id``
and ``os_command_line`` on a flavor with ``hw:tpm_version=2.0``: qemu (TCG:
these machines have no usable KVM) on q35 with OVMF (``-bios``), which
measures the firmware and the kernel into the vTPM (SeaBIOS would not
measure the kernel), the kernel and initramfs given directly, a TPM CRB
device backed by ``swtpm socket --tpm2`` over a unix socket. The disk is a
throw-away qcow2 overlay on the cached image. cloud-init finds its
user-data on an ISO 9660 volume labelled ``cidata`` (NoCloud).

The serial console goes to a file (``serial.log`` in the work directory):
:meth:`VmGuest.console` returns it without CRs and ANSI escapes. The only
network is qemu user networking, whose forwarded ports listen on
127.0.0.1 of the host (never a private-range address in the host's
namespace); inside it the guest reaches the host's 127.0.0.1 as 10.0.2.2.

The hypervisor's side of a VM's life: :attr:`VmGuest.agent` runs commands
and reads files through the qemu guest agent (Nova's
``hw_qemu_guest_agent``), :attr:`VmGuest.qmp` is qemu's monitor
(``system_reset``), :meth:`VmGuest.kill` and :meth:`VmGuest.relaunch`
stop qemu and swtpm without warning and start them again on the same disk
and vTPM state (a host crash), :meth:`VmGuest.save_tpm_state` and
:meth:`VmGuest.restore_tpm_state` replay an older vTPM state. With
``localca_dir`` the vTPM is manufactured as libvirt does for Nova:
``swtpm_setup --create-ek-cert --vmid instance-00000001:<uuid>`` with a
swtpm local CA, so the EK certificate chains to that CA.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from types import TracebackType

from trusted_testing.guest_vm import ImageError, VmImage, build
from trusted_testing.nocloud import make_seed
from trusted_testing.procs import spawn
from trusted_testing.qemu import (
    OVMF,
    file_tails,
    kill_groups,
    swtpm_argv,
    tpm_qemu_args,
    wait_path,
)
from trusted_testing.qga import GuestAgent, GuestAgentError, Qmp
from trusted_testing.swtpm import free_ports, write_localca_config

BOOT_TIMEOUT = 900.0
BOOTSTRAP = "/etc/trusted-cloud/bootstrap.json"
AGENT_PORT = 9002
# Console lines (cleaned) that mark the stages of a boot.
KERNEL_STARTED = re.compile(r"^\[\s*0\.0+\] Linux version", re.M)
CLOUD_INIT_DONE = re.compile(
    r"Cloud-init v\. \S+ finished at .*Up ([\d.]+) seconds", re.M
)
# trusted-agent.service logs to the console: "[ uptime] trusted-agent[pid]: ".
AGENT_LOGGED = re.compile(r"^.*\btrusted-agent\[\d+\]: .*$", re.M)
# Escape sequences of the firmware and of systemd's coloured status lines.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[()][0-9A-Za-z]|[@-Z\\-_])")


@dataclasses.dataclass(frozen=True)
class Firmware:
    """UEFI firmware in two flash images, as libvirt gives it for
    ``<loader type='pflash' secure='yes'>`` + ``<nvram template=...>``: the
    code (read-only) and the template of the guest's variable store (copied
    into the work directory: the guest's NVRAM, kept across relaunches).
    The guest then boots its disk, not a kernel given to qemu."""

    code: str
    vars_template: str


class VmGuestError(Exception):
    """The guest did not start or did not reach a state in time."""


def clean_console(raw: bytes) -> str:
    """Serial console bytes as text: no CRs, no ANSI escapes.

    Args:
        raw: What qemu wrote to the serial file.

    Returns:
        The text, one console line per line.
    """
    text = raw.decode("utf-8", errors="replace").replace("\r", "")
    return _ANSI.sub("", text)


class VmGuest:
    """A running guest: qemu (TCG, q35, OVMF) + swtpm + a NoCloud seed."""

    def __init__(
        self,
        image: VmImage,
        user_data: str | bytes,
        *,
        instance_id: str = "trusted-guest",
        memory_mb: int = 1024,
        forward: Sequence[int] | Mapping[int, int] = (),
        extra_cmdline: str = "panic=-1",
        keep_dir: bool = False,
        vendor_data: str | None = None,
        localca_dir: str | None = None,
        allow_reboot: bool = False,
        firmware: Firmware | None = None,
    ) -> None:
        """Prepare (but do not start) a guest.

        Args:
            image: The built image.
            user_data: The user-data cloud-init reads from the seed.
            instance_id: The NoCloud ``instance-id`` (a Nova instance UUID).
            memory_mb: Guest memory.
            forward: Guest TCP ports to forward from 127.0.0.1 of the host
                (free host ports are chosen), or a mapping of guest port to
                host port.
            extra_cmdline: Appended to the image's kernel command line.
            keep_dir: Keep the work directory (console log, disks) on stop.
            vendor_data: The NoCloud vendor-data (the provider's part).
            localca_dir: A swtpm local CA: the vTPM gets an EK certificate
                signed by it (see the module doc). None: no EK certificate.
            allow_reboot: A guest reboot or a reset restarts the guest
                (else qemu exits, ``-no-reboot``).
            firmware: Boot the disk (a whole-disk image) with this UEFI
                firmware in flash, SMM on (Secure Boot builds need it);
                None: OVMF as ``-bios`` and the image's kernel given to qemu.
        """
        self.image = image
        self.user_data = user_data
        self.instance_id = instance_id
        self.memory_mb = memory_mb
        if isinstance(forward, Mapping):
            self.forward = dict(forward)
        else:
            base = free_ports(len(forward)) if forward else 0
            self.forward = {guest: base + i for i, guest in enumerate(forward)}
        self.extra_cmdline = extra_cmdline
        self.keep_dir = keep_dir
        self.vendor_data = vendor_data
        self.localca_dir = localca_dir
        self.allow_reboot = allow_reboot
        self.firmware = firmware
        self.workdir = ""
        #: guest port -> the host port (on 127.0.0.1) forwarded to it
        self.ports = dict(self.forward)
        self.started = 0.0
        self._swtpm_argv: list[str] = []
        self._tpm_sock = ""
        self._swtpm: subprocess.Popen[bytes] | None = None
        self._qemu: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> VmGuest:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def agent(self) -> GuestAgent:
        """The qemu guest agent of this guest."""
        return GuestAgent(os.path.join(self.workdir, "qga.sock"))

    @property
    def qmp(self) -> Qmp:
        """qemu's monitor of this guest."""
        return Qmp(os.path.join(self.workdir, "qmp.sock"))

    @property
    def tpm_state(self) -> str:
        """The vTPM's state directory."""
        return os.path.join(self.workdir, "tpm")

    @property
    def nvram(self) -> str:
        """The guest's UEFI variable store (with ``firmware``)."""
        return os.path.join(self.workdir, "vars.fd")

    def replace_nvram(self, template: str) -> None:
        """Start the next launch from another variable store (call between
        :meth:`kill` and :meth:`relaunch`): e.g. one without keys, which
        turns Secure Boot off."""
        if self._qemu is not None:
            raise VmGuestError("replace_nvram: qemu is running (kill first)")
        shutil.copyfile(template, self.nvram)

    @property
    def serial_log(self) -> str:
        """Path of the raw serial console file."""
        return os.path.join(self.workdir, "serial.log")

    def start(self) -> None:
        """Start swtpm and qemu (returns once qemu runs; see :meth:`wait_for`).

        Raises:
            VmGuestError: If a tool is missing or a process exits at once.
        """
        self.workdir = tempfile.mkdtemp(prefix="trusted-vm-")
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self._swtpm_argv, self._tpm_sock = swtpm_argv(self.workdir)
        if self.localca_dir is not None:
            self._manufacture_vtpm(self.localca_dir)
        seed = os.path.join(self.workdir, "seed.iso")
        disk = os.path.join(self.workdir, "disk.qcow2")
        meta = f"instance-id: {self.instance_id}\nlocal-hostname: trusted-guest\n"
        make_seed(seed, self.user_data, meta, self.vendor_data)
        if self.firmware is not None:
            shutil.copyfile(self.firmware.vars_template, self.nvram)
        self._check(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2",
             "-b", self.image.qcow2, disk],
            "qemu-utils",
        )  # fmt: skip
        self.relaunch()

    def _manufacture_vtpm(self, localca_dir: str) -> None:
        """The vTPM's state with an EK certificate, as libvirt makes it."""
        config = write_localca_config(localca_dir)
        self._check(
            ["swtpm_setup", "--tpm2", "--tpmstate", self.tpm_state,
             "--create-ek-cert", "--create-platform-cert", "--config", config,
             "--vmid", f"instance-00000001:{self.instance_id}", "--overwrite"],
            "swtpm-tools",
        )  # fmt: skip

    def relaunch(self) -> None:
        """Start swtpm and qemu on the existing disk and vTPM state (after
        :meth:`kill`, or the first time)."""
        self._swtpm = self._spawn(self._swtpm_argv, "swtpm.out", "swtpm")
        self._wait_path(self._tpm_sock, self._swtpm, "swtpm", 30.0)
        netdev = "user,id=n0" + "".join(
            f",hostfwd=tcp:127.0.0.1:{host}-:{guest}"
            for guest, host in self.ports.items()
        )
        work = self.workdir
        reboot = [] if self.allow_reboot else ["-no-reboot"]
        nic = "virtio-net-pci,netdev=n0" + (",romfile=" if self.firmware else "")
        self.started = time.monotonic()
        machine, boot, disk = self._boot_args()
        self._qemu = self._spawn(
            ["qemu-system-x86_64",
             "-machine", machine, "-smp", "1", "-m", str(self.memory_mb),
             *boot, "-display", "none", "-monitor", "none", *reboot,
             *self._kernel_args(),
             "-serial", f"file:{self.serial_log}",
             *tpm_qemu_args(self._tpm_sock),
             *disk,
             "-drive", f"file={work}/seed.iso,if=virtio,format=raw,readonly=on",
             "-netdev", netdev, "-device", nic,
             "-qmp", f"unix:{work}/qmp.sock,server=on,wait=off",
             "-chardev", f"socket,path={work}/qga.sock,server=on,wait=off,id=qga0",
             "-device", "virtio-serial",
             "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0"],
            "qemu.out",
            "qemu-system-x86",
        )  # fmt: skip

    def _boot_args(self) -> tuple[str, list[str], list[str]]:
        """The machine, the firmware and the boot disk: OVMF as ``-bios``
        for a direct kernel boot (the argv this harness always had), or
        UEFI in flash with SMM and the disk first in the boot order."""
        disk = f"file={self.workdir}/disk.qcow2"
        if self.firmware is None:
            direct = ["-drive", f"{disk},if=virtio,format=qcow2"]
            return "q35,accel=tcg", ["-bios", OVMF], direct
        code = f"if=pflash,format=raw,unit=0,readonly=on,file={self.firmware.code}"
        firmware = [
            "-global", "driver=cfi.pflash01,property=secure,value=on",
            "-drive", code,
            "-drive", f"if=pflash,format=raw,unit=1,file={self.nvram}",
        ]  # fmt: skip
        boot_disk = [
            "-drive", f"{disk},if=none,id=disk0,format=qcow2",
            "-device", "virtio-blk-pci,drive=disk0,bootindex=0",
        ]  # fmt: skip
        return "q35,accel=tcg,smm=on", firmware, boot_disk

    def _kernel_args(self) -> list[str]:
        """The kernel qemu loads (none when the firmware boots the disk)."""
        if self.firmware is not None:
            return []
        return [
            "-kernel", self.image.kernel, "-initrd", self.image.initrd,
            "-append", f"{self.image.cmdline} {self.extra_cmdline}".strip(),
        ]  # fmt: skip

    def kill(self) -> None:
        """Kill qemu and swtpm without warning (a host crash); the disk,
        the vTPM state and the console log stay for :meth:`relaunch`."""
        kill_groups(self._qemu, self._swtpm)
        self._qemu = self._swtpm = None
        for name in ("swtpm.sock", "qmp.sock", "qga.sock"):
            path = os.path.join(self.workdir, name)
            if os.path.exists(path):
                os.unlink(path)

    def save_tpm_state(self, directory: str) -> None:
        """Copy the vTPM's state as it is now on disk to ``directory``."""
        shutil.copytree(self.tpm_state, directory)

    def restore_tpm_state(self, directory: str) -> None:
        """Replace the vTPM's state by a copy (call between :meth:`kill`
        and :meth:`relaunch`)."""
        if self._swtpm is not None:
            raise VmGuestError("restore_tpm_state: swtpm is running (kill first)")
        shutil.rmtree(self.tpm_state)
        shutil.copytree(directory, self.tpm_state)

    def stop(self) -> None:
        """Kill qemu and swtpm (by PID) and remove the work directory."""
        kill_groups(self._qemu, self._swtpm)
        self._qemu = self._swtpm = None
        if self.workdir and not self.keep_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def console(self) -> str:
        """The serial console so far, cleaned (:func:`clean_console`)."""
        try:
            with open(self.serial_log, "rb") as handle:
                return clean_console(handle.read())
        except FileNotFoundError:
            return ""

    def elapsed(self) -> float:
        """Seconds since qemu was started."""
        return time.monotonic() - self.started

    def wait_for(
        self, pattern: re.Pattern[str], timeout: float = BOOT_TIMEOUT, what: str = ""
    ) -> re.Match[str]:
        """Wait until the cleaned console matches ``pattern``.

        Args:
            pattern: A compiled regular expression (``re.M`` for line anchors).
            timeout: Seconds to wait.
            what: What is awaited, for the error.

        Returns:
            The first match.

        Raises:
            VmGuestError: On a timeout, or when qemu exits first.
        """
        deadline = time.monotonic() + timeout
        while True:
            found = pattern.search(self.console())
            if found:
                return found
            if self._qemu is None or self._qemu.poll() is not None:
                code = None if self._qemu is None else self._qemu.returncode
                raise VmGuestError(
                    f"qemu exited ({code}) before {what or pattern.pattern}\n"
                    + self._tail()
                )
            if time.monotonic() > deadline:
                raise VmGuestError(
                    f"timed out after {timeout:.0f}s waiting for "
                    f"{what or pattern.pattern}\n{self._tail()}"
                )
            time.sleep(0.5)

    def _spawn(
        self, argv: list[str], log: str, package: str
    ) -> subprocess.Popen[bytes]:
        try:
            return spawn(argv, os.path.join(self.workdir, log))
        except FileNotFoundError as exc:
            raise VmGuestError(
                f"{argv[0]} is missing: install the Debian package {package}"
            ) from exc

    @staticmethod
    def _check(argv: list[str], package: str) -> None:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
        except FileNotFoundError as exc:
            raise VmGuestError(
                f"{argv[0]} is missing: install the Debian package {package}"
            ) from exc
        if done.returncode:
            raise VmGuestError(f"{argv[0]} failed: {done.stderr[-500:]}")

    def _wait_path(
        self, path: str, proc: subprocess.Popen[bytes], name: str, timeout: float
    ) -> None:
        wait_path(
            path,
            proc,
            timeout,
            lambda why: VmGuestError(f"{name}: {why}: {self._tail()}"),
        )

    def diagnosis(self) -> str:
        """What qemu says of a guest that seems stuck: its run state, the
        CPU's registers and the tails of qemu's, swtpm's and the console's
        logs (for a test's failure message)."""
        parts = []
        for command, args in (
            ("query-status", None),
            ("human-monitor-command", {"command-line": "info registers"}),
        ):
            try:
                answer = self.qmp.call(command, args)
            except GuestAgentError as exc:
                answer = f"(no answer: {exc})"
            parts.append(f"[qmp {command}] {str(answer)[:1500]}")
        parts += file_tails(self.workdir, ("swtpm.log",), 1500)
        return "\n".join([*parts, self._tail()])

    def _tail(self) -> str:
        parts = [f"[serial.log] {self.console()[-2000:]}"]
        parts += file_tails(self.workdir, ("qemu.out", "swtpm.out"), 800)
        return "\n".join(parts)


def bootstrap_user_data(bootstrap: dict[str, object]) -> str:
    """A cloud-config that writes ``bootstrap`` to :data:`BOOTSTRAP`."""
    config = {
        "write_files": [
            {"path": BOOTSTRAP, "permissions": "0600", "content": json.dumps(bootstrap)}
        ]
    }
    # JSON is YAML: cloud-init parses it as a cloud-config.
    return "#cloud-config\n" + json.dumps(config, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Command line: boot the (cached) image once and print its timings."""
    parser = argparse.ArgumentParser(
        description="Boot the guest image (qemu TCG + OVMF + swtpm + NoCloud) "
        "and print how long each stage took."
    )
    parser.add_argument("--keep", action="store_true", help="keep the work dir")
    parser.add_argument("--memory", type=int, default=1024, help="MiB")
    args = parser.parse_args(argv)
    try:
        image = build()
    except ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    node = str(uuid.uuid4())
    guest = VmGuest(
        image,
        bootstrap_user_data({"uuid": node}),
        instance_id=node,
        memory_mb=args.memory,
        forward=(AGENT_PORT,),
        keep_dir=args.keep,
    )
    marks: list[tuple[str, float]] = []
    try:
        with guest:
            for name, pattern in (
                ("kernel started", KERNEL_STARTED),
                ("cloud-init done", CLOUD_INIT_DONE),
                ("agent logged", AGENT_LOGGED),
            ):
                guest.wait_for(pattern, what=name)
                marks.append((name, guest.elapsed()))
            uptime = CLOUD_INIT_DONE.search(guest.console())
    except VmGuestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, seconds in marks:
        print(f"{name}: {seconds:.1f} s after qemu started")
    if uptime is not None:
        print(f"cloud-init done at guest uptime {float(uptime.group(1)):.1f} s")
    if args.keep:
        print(f"work dir: {guest.workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
