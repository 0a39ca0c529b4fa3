"""What the measured guest (:mod:`trusted_testing.guest`) and the guest VM
(:mod:`trusted_testing.guest_vm_boot`) share: a swtpm vTPM on a unix
socket, qemu's TPM arguments for it, waiting for a socket to appear, the
tails of the processes' logs, and stopping them."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence

__all__ = [
    "OVMF",
    "file_tails",
    "kill_groups",
    "swtpm_argv",
    "tpm_qemu_args",
    "wait_path",
]

#: UEFI firmware: it measures the kernel into PCR 4 (SeaBIOS does not).
OVMF = "/usr/share/ovmf/OVMF.fd"


def swtpm_argv(workdir: str) -> tuple[list[str], str]:
    """The command of a TPM 2.0 swtpm keeping its state in ``workdir/tpm``
    (created) and its log in ``workdir/swtpm.log``, and its socket path."""
    state = os.path.join(workdir, "tpm")
    os.makedirs(state)
    sock = os.path.join(workdir, "swtpm.sock")
    argv = [
        "swtpm", "socket", "--tpm2",
        "--ctrl", f"type=unixio,path={sock}",
        "--tpmstate", f"dir={state}",
        "--log", f"file={os.path.join(workdir, 'swtpm.log')}",
    ]  # fmt: skip
    return argv, sock


def tpm_qemu_args(sock: str) -> list[str]:
    """qemu's arguments for a CRB TPM served by the swtpm at ``sock``."""
    return [
        "-chardev", f"socket,id=chrtpm,path={sock}",
        "-tpmdev", "emulator,id=tpm0,chardev=chrtpm",
        "-device", "tpm-crb,tpmdev=tpm0",
    ]  # fmt: skip


def wait_path(
    path: str,
    proc: subprocess.Popen[bytes],
    timeout: float,
    failed: Callable[[str], Exception],
) -> None:
    """Wait until ``path`` exists.

    Raises:
        Exception: ``failed(reason)`` if ``proc`` exits first or time runs out.
    """
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise failed(f"exited ({proc.returncode})")
        if time.monotonic() > deadline:
            raise failed(f"{path} did not appear in {timeout:.0f}s")
        time.sleep(0.05)


def file_tails(workdir: str, names: Sequence[str], limit: int) -> list[str]:
    """``[name] <last limit bytes>`` of each of ``names`` in ``workdir``
    that exists."""
    parts = []
    for name in names:
        path = os.path.join(workdir, name)
        if os.path.exists(path):
            with open(path, "rb") as handle:
                tail = handle.read()[-limit:].decode(errors="replace")
            parts.append(f"[{name}] {tail}")
    return parts


def kill_groups(*procs: subprocess.Popen[bytes] | None) -> None:
    """Kill each running process's group and reap it."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
