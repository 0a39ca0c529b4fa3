"""Boot the measured guest under qemu with OVMF and a swtpm vTPM, and read
its real measured-boot and IMA logs and PCRs from inside.

The guest (see :mod:`trusted_testing.guest_image`) is a Debian kernel booted
by OVMF (which measures the firmware and the kernel into PCRs 0-7 and hands
the kernel the TCG event log; the kernel's EFI stub measures its command
line and initrd into PCR 9) with
``ima_policy=tcb ima_hash=sha256``, so the kernel's IMA measures what the
init runs and reads from a squashfs and from a writable ext4 disk into PCR 10.

The host drives a busybox shell on the guest's serial console (a qemu unix
socket chardev): each command's output comes back base64-encoded between
markers, so CRLF and the firmware's ANSI escapes never corrupt a log. PCRs
are volatile, so they are read in the guest from
``/sys/class/tpm/tpm0/pcr-<bank>/<n>``.

Usage::

    with Guest() as guest:
        good = guest.capture()
        guest.tamper_script()
        bad = guest.capture()

Everything runs in a fresh temporary directory; qemu and swtpm are killed
(by PID) on exit, when the parent process dies, or on a timeout.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
from types import TracebackType
from typing import BinaryIO

from trusted_testing.guest_capture import Capture, measured_boot_reference
from trusted_testing.guest_image import GuestImage, build, make_writable_disk
from trusted_testing.procs import spawn
from trusted_testing.qemu import (
    OVMF,
    file_tails,
    kill_groups,
    swtpm_argv,
    tpm_qemu_args,
    wait_path,
)
from verifier.protocol.credential import CredentialChallenge

CMDLINE = "console=ttyS0 ima_policy=tcb ima_hash=sha256 no_timer_check panic=-1"
BIOS_LOG = "/sys/kernel/security/tpm0/binary_bios_measurements"
IMA_ASCII = "/sys/kernel/security/ima/ascii_runtime_measurements"
IMA_BINARY = "/sys/kernel/security/ima/binary_runtime_measurements"
BANKS = ("sha1", "sha256", "sha384", "sha512")  # all four are active in swtpm
PCRS = range(11)
# The measured script on the writable disk, and where a tamper step drops an
# executable the policy has never seen.
TOOL = "/w/bin/tool.sh"
INTRUDER = "/w/bin/uname"
# A file root reads while it is open for writing: IMA logs an open_writers
# violation (zero digests; PCR 10 extended with all-0xFF), then measures it.
RACED = "/w/data.txt"
BOOT_TIMEOUT = 900.0
COMMAND_TIMEOUT = 300.0
_READY = re.compile(rb"(?m)^@@READY\r?$")
_FAIL = re.compile(rb"(?m)^@@FAIL ([^\r\n]*)")
# tpm2-tools' credential file: magic and version, then TPM2B_ID_OBJECT and
# TPM2B_ENCRYPTED_SECRET.
_CREDENTIAL_HEADER = struct.pack(">II", 0xBADCC0DE, 1)
__all__ = ["Capture", "Guest", "GuestError", "measured_boot_reference"]
_PCR_LINE = re.compile(r"^(sha1|sha256|sha384|sha512) (\d+) ([0-9A-Fa-f]+)$")


class GuestError(Exception):
    """The guest did not boot, or a command in it failed or timed out."""


class Guest:
    """A running measured guest (qemu + OVMF + swtpm), driven over serial."""

    def __init__(
        self,
        image: GuestImage | None = None,
        *,
        memory_mb: int = 512,
        boot_timeout: float = BOOT_TIMEOUT,
        keep_dir: bool = False,
    ) -> None:
        """Prepare (but do not start) a guest.

        Args:
            image: The built image (default: build or reuse the cached one).
            memory_mb: Guest memory.
            boot_timeout: Seconds to wait for the guest's shell.
            keep_dir: Keep the temporary directory (serial transcript, disks).
        """
        self.image = image
        self.memory_mb = memory_mb
        self.boot_timeout = boot_timeout
        self.keep_dir = keep_dir
        self.workdir = ""
        self.boot_seconds = 0.0
        self._swtpm: subprocess.Popen[bytes] | None = None
        self._qemu: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._buffer = b""
        self._transcript: BinaryIO | None = None
        self._serial = 0

    # -- lifecycle ---------------------------------------------------------

    def __enter__(self) -> Guest:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start swtpm and qemu, and wait until the guest's shell is ready.

        Raises:
            GuestError: If the guest does not come up in time.
        """
        if self.image is None:
            self.image = build()
        self.workdir = tempfile.mkdtemp(prefix="trusted-guest-")
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        assert self.image is not None
        started = time.monotonic()
        swtpm, tpm_sock = swtpm_argv(self.workdir)
        serial_sock = os.path.join(self.workdir, "serial.sock")
        disk = os.path.join(self.workdir, "writable.img")
        make_writable_disk(self.image, disk)
        self._swtpm = self._spawn(swtpm, "swtpm.out")
        self._wait_path(tpm_sock, self._swtpm, "swtpm", 30.0)
        self._qemu = self._spawn(
            [
                "qemu-system-x86_64",
                "-machine", "q35,accel=tcg", "-m", str(self.memory_mb),
                "-bios", OVMF, "-display", "none", "-monitor", "none", "-no-reboot",
                "-kernel", self.image.kernel, "-initrd", self.image.initrd,
                "-append", CMDLINE,
                "-chardev", f"socket,id=ser0,path={serial_sock},server=on,wait=on",
                "-serial", "chardev:ser0",
                *tpm_qemu_args(tpm_sock),
                "-drive",
                f"file={self.image.squashfs},if=virtio,format=raw,readonly=on",
                "-drive", f"file={disk},if=virtio,format=raw",
            ],
            "qemu.out",
        )  # fmt: skip
        self._wait_path(serial_sock, self._qemu, "qemu", 60.0)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(serial_sock)
        self._transcript = open(os.path.join(self.workdir, "serial.log"), "wb")  # noqa: SIM115
        self._read_until(_READY, self.boot_timeout, "the guest's shell")
        failed = _FAIL.search(self._buffer)
        if failed:
            raise GuestError(
                f"guest init failed: {failed.group(1).decode(errors='replace')}"
            )
        self._buffer = b""
        self.boot_seconds = time.monotonic() - started

    def stop(self) -> None:
        """Kill qemu and swtpm (by PID) and remove the temporary directory."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        kill_groups(self._qemu, self._swtpm)
        self._qemu = self._swtpm = None
        transcript = self._transcript
        if transcript is not None:
            transcript.close()
            self._transcript = None
        if self.workdir and not self.keep_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _spawn(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        try:
            return spawn(argv, os.path.join(self.workdir, log))
        except FileNotFoundError as exc:
            raise GuestError(
                f"{argv[0]} is missing (see tools/apt-packages.txt)"
            ) from exc

    def _wait_path(
        self, path: str, proc: subprocess.Popen[bytes], name: str, timeout: float
    ) -> None:
        wait_path(
            path,
            proc,
            timeout,
            lambda why: GuestError(f"{name}: {why}: {self._tail()}"),
        )

    def _tail(self) -> str:
        names = ("qemu.out", "swtpm.out", "serial.log")
        return "\n".join(file_tails(self.workdir, names, 1500))

    # -- serial protocol ---------------------------------------------------

    def _read_until(
        self, pattern: re.Pattern[bytes], timeout: float, what: str
    ) -> re.Match[bytes]:
        assert self._sock is not None
        deadline = time.monotonic() + timeout
        while True:
            found = pattern.search(self._buffer)
            if found:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise GuestError(
                    f"timed out after {timeout:.0f}s waiting for {what}\n{self._tail()}"
                )
            if self._qemu is not None and self._qemu.poll() is not None:
                raise GuestError(
                    f"qemu exited ({self._qemu.returncode}) waiting for {what}\n"
                    + self._tail()
                )
            self._sock.settimeout(min(left, 1.0))
            try:
                chunk = self._sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                raise GuestError(
                    f"the serial console closed waiting for {what}\n{self._tail()}"
                )
            self._buffer += chunk
            if self._transcript is not None:
                self._transcript.write(chunk)
                self._transcript.flush()

    def run(
        self, command: str, timeout: float = COMMAND_TIMEOUT, check: bool = True
    ) -> tuple[int, bytes]:
        """Run a shell command in the guest.

        Args:
            command: One line of busybox ``sh``.
            timeout: Seconds to wait for it.
            check: Raise when the command exits non-zero.

        Returns:
            The exit status and the command's combined stdout and stderr.

        Raises:
            GuestError: On a timeout, or a non-zero status with ``check``.
        """
        if self._sock is None:
            raise GuestError("the guest is not running")
        if "\n" in command:
            raise GuestError("one line per command")
        self._serial += 1
        n = self._serial
        line = (
            f"( {command} ) >/tmp/.out 2>&1; r=$?; "
            f"echo @@B{n}; base64 /tmp/.out; echo @@E{n} $r\n"
        )
        self._sock.sendall(line.encode())
        end = self._read_until(
            re.compile(rb"(?m)@@E%d (\d+)\r?$" % n), timeout, f"`{command}`"
        )
        begin = re.search(rb"(?m)@@B%d\r?$" % n, self._buffer)
        if begin is None:
            raise GuestError(f"no output marker for `{command}`")
        body = self._buffer[begin.end() : end.start()]
        self._buffer = self._buffer[end.end() :]
        text = b"".join(
            ln.strip()
            for ln in body.splitlines()
            if re.fullmatch(rb"[A-Za-z0-9+/=]*", ln.strip())
        )
        try:
            output = base64.b64decode(text, validate=True)
        except binascii.Error as exc:
            raise GuestError(f"garbled output of `{command}`") from exc
        status = int(end.group(1))
        if check and status:
            raise GuestError(
                f"`{command}` exited {status}: {output[-500:].decode(errors='replace')}"
            )
        return status, output

    def read_file(self, path: str) -> bytes:
        """Read a file in the guest (binary-safe)."""
        return self.run(f"cat {path}")[1]

    def read_pcrs(self) -> dict[str, dict[int, bytes]]:
        """PCRs 0-10 of every bank (sha1, sha256, sha384, sha512), read in the guest."""
        loop = (
            "for b in "
            + " ".join(BANKS)
            + "; do for i in "
            + " ".join(str(i) for i in PCRS)
            + "; do "
            'echo "$b $i $(cat /sys/class/tpm/tpm0/pcr-$b/$i)"; done; done'
        )
        pcrs: dict[str, dict[int, bytes]] = {bank: {} for bank in BANKS}
        for line in self.run(loop)[1].decode().splitlines():
            found = _PCR_LINE.match(line.strip())
            if not found:
                raise GuestError(f"unexpected PCR line {line!r}")
            pcrs[found.group(1)][int(found.group(2))] = bytes.fromhex(found.group(3))
        return pcrs

    def capture(self, nonce: bytes | None = None) -> Capture:
        """Read the event log, both IMA lists and the PCRs, consistently.

        Nothing this reads is measured (securityfs, sysfs and the initramfs
        are outside ``ima_policy=tcb``), so the IMA lists and PCR 10 match.

        Args:
            nonce: Also quote PCRs 0-10 (sha256) first, with this nonce, as
                an agent does before it reads the logs.
        """
        attest = signature = ak = b""
        if nonce is not None:
            ak = self.ak_public()
            attest, signature = self.quote(nonce)
        return Capture(
            bios_log=self.read_file(BIOS_LOG),
            ima_ascii=self.read_file(IMA_ASCII),
            ima_binary=self.read_file(IMA_BINARY),
            pcrs=self.read_pcrs(),
            ak_public=ak,
            nonce=nonce or b"",
            attest=attest,
            signature=signature,
        )

    # -- attestation -------------------------------------------------------

    def ak_public(self) -> bytes:
        """The TPM2B_PUBLIC of the attestation key the guest made at boot
        (ECC P-256, restricted signing, under the EK)."""
        return self.read_file("/state/ak.pub")

    def ek_public(self) -> bytes:
        """The TPM2B_PUBLIC of the endorsement key (RSA 2048, default template)."""
        return self.read_file("/state/ek.pub")

    def activate_credential(self, challenge: CredentialChallenge) -> bytes:
        """TPM2_ActivateCredential in the guest (EK policy: PolicySecret of
        the endorsement hierarchy), as an agent answers a registrar.

        Args:
            challenge: :func:`verifier.protocol.credential.make_credential`
                for the guest's EK and the Name of its AK.

        Returns:
            The credential the guest's TPM recovered.
        """
        blob = _CREDENTIAL_HEADER + challenge.credential_blob
        blob += challenge.encrypted_secret
        session = "/state/session.ctx"
        self.run(f"echo {base64.b64encode(blob).decode()} | base64 -d > /state/cred.in")
        self.run(
            f"tpm2_startauthsession --policy-session -S {session} >/dev/null && "
            f"tpm2_policysecret -S {session} -c e >/dev/null && "
            "tpm2_activatecredential -c /state/ak.ctx -C /state/ek.ctx "
            f"-i /state/cred.in -o /state/cred.out -P session:{session} >/dev/null; "
            f"r=$?; tpm2_flushcontext {session}; exit $r"
        )
        return self.read_file("/state/cred.out")

    def quote(
        self, nonce: bytes, pcrs: range | tuple[int, ...] = PCRS
    ) -> tuple[bytes, bytes]:
        """A TPM2_Quote of the sha256 bank made in the guest with tpm2-tools.

        Args:
            nonce: The qualifying data (at most 64 bytes).
            pcrs: The PCRs to quote.

        Returns:
            The TPMS_ATTEST and the TPMT_SIGNATURE.
        """
        selection = "sha256:" + ",".join(str(i) for i in pcrs)
        self.run(
            f"tpm2_quote -c /state/ak.ctx -l {selection} -q {nonce.hex()} -g sha256 "
            "-m /state/quote.msg -s /state/quote.sig >/dev/null"
        )
        return self.read_file("/state/quote.msg"), self.read_file("/state/quote.sig")

    # -- tampering ---------------------------------------------------------

    def tamper_script(self) -> str:
        """Change the measured script on the writable disk and run it again.

        Returns:
            The script's path in the guest (IMA measures its new digest).
        """
        self.run(f"echo 'echo tampered' >> {TOOL} && sync && {TOOL}")
        return TOOL

    def run_unknown_binary(self) -> str:
        """Copy busybox to the writable disk as ``uname`` and run it.

        Returns:
            The new executable's path in the guest.
        """
        self.run(f"cp /bin/busybox {INTRUDER} && sync && {INTRUDER}")
        return INTRUDER

    def cause_violation(self) -> str:
        """Read a new file on the writable disk while it is open for writing.

        Returns:
            Its path (logged once as a violation, once as a measurement).
        """
        self.run(f"echo data > {RACED} && sync && sh -c 'exec 4>>{RACED}; cat {RACED}'")
        return RACED

    def tamper(self) -> list[tuple[str, str]]:
        """All three tamper steps, in order.

        Returns:
            The ``(path, reason)`` failures a runtime policy built from the
            list before them must report.
        """
        script = self.tamper_script()
        intruder = self.run_unknown_binary()
        raced = self.cause_violation()
        return [
            (script, "digest_mismatch"),
            (intruder, "unknown_file"),
            (raced, "violation"),
            (raced, "unknown_file"),
        ]
