"""A vTPM's swtpm state, created before the domain's first start.

libvirt keeps the state of a domain's TPM 2.0 emulator in
``<swtpm storage dir>/<domain uuid>/tpm2`` (``/var/lib/libvirt/swtpm`` for
the system daemon, ``<root>/lib/swtpm`` for ``qemu:///embed?root=<root>``)
and runs ``swtpm_setup`` only when that directory holds no state. The
manager runs ``swtpm_setup`` itself, the way libvirt would (EK, EK and
platform certificates from the compute host's local CA, NVRAM locked), so
the EK is known on the provider side before the guest ever runs. The EK is
then read back from a private copy of the state with a short-lived swtpm,
so a running domain's own swtpm is never disturbed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

from verifier.common.errors import TpmError
from verifier.common.swtpm_localca import free_ports, write_localca_config
from verifier.common.tpm import Tpm
from vtpm_manager.exceptions import SwtpmSetupError
from vtpm_manager.identity import EkIdentity

__all__ = [
    "EkIdentity",
    "create_state",
    "has_state",
    "locked",
    "read_ek",
    "state_dir",
]

_STATE_FILE = "tpm2-00.permall"
_CIPHER = "aes-256-cbc"  # what libvirt passes for an encrypted state
_SETUP_TIMEOUT = 120.0
_START_TIMEOUT = 10.0


def state_dir(storage_dir: str, domain_uuid: str) -> str:
    """libvirt's TPM 2.0 state directory of a domain."""
    return os.path.join(storage_dir, domain_uuid.lower(), "tpm2")


@contextlib.contextmanager
def locked(storage_dir: str, domain_uuid: str) -> Iterator[None]:
    """Serialize work on one domain's vTPM across processes (the hook, the
    CLI, a listener): an exclusive ``flock`` on
    ``<storage_dir>/.<uuid>.vtpm-lock``, released when the block ends."""
    os.makedirs(storage_dir, mode=0o711, exist_ok=True)
    path = os.path.join(storage_dir, f".{domain_uuid.lower()}.vtpm-lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def has_state(path: str) -> bool:
    """Whether ``path`` holds a manufactured TPM 2.0 state."""
    return os.path.exists(os.path.join(path, _STATE_FILE))


@contextlib.contextmanager
def _password_file(secret: bytes | None) -> Iterator[str | None]:
    """The state passphrase in a private temporary file, removed afterwards."""
    if secret is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="vtpm-key-") as tmp:
        path = os.path.join(tmp, "pwd")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secret)
        yield path


def _tail(path: str, limit: int = 1500) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()[-limit:].strip()
    except OSError:
        return "(no log)"


def create_state(
    path: str,
    localca_dir: str,
    vmid: str,
    secret: bytes | None = None,
    swtpm_setup: str = "swtpm_setup",
) -> bool:
    """Manufacture a TPM 2.0 state in ``path`` unless one is there.

    On failure nothing is left behind: a directory this call created is
    removed again.

    Args:
        path: the state directory (see :func:`state_dir`).
        localca_dir: the compute host's local CA signing EK certificates.
        vmid: the VM id swtpm_setup writes into the certificates
            (``name:uuid`` like libvirt).
        secret: the passphrase encrypting the state (Nova's vTPM secret).
        swtpm_setup: the swtpm_setup executable.

    Returns:
        True if a state was created, False if one existed.

    Raises:
        SwtpmSetupError: swtpm_setup failed or could not run.
    """
    if has_state(path):
        return False
    parent = os.path.dirname(path)
    created = [p for p in (parent, path) if not os.path.isdir(p)]
    os.makedirs(parent, mode=0o711, exist_ok=True)
    os.makedirs(path, mode=0o700, exist_ok=True)
    try:
        config = write_localca_config(localca_dir)
        log = os.path.join(localca_dir, f"swtpm_setup-{os.getpid()}.log")
        with _password_file(secret) as pwd:
            result = _run_setup(swtpm_setup, path, config, vmid, pwd, log, True)
            if result != 0:  # some swtpm builds cannot make platform certs
                result = _run_setup(swtpm_setup, path, config, vmid, pwd, log, False)
        if result != 0 or not has_state(path):
            raise SwtpmSetupError(
                f"swtpm_setup failed for {path} (exit code {result}): {_tail(log)}"
            )
        with contextlib.suppress(OSError):
            os.unlink(log)
    except BaseException:
        for p in reversed(created):
            shutil.rmtree(p, ignore_errors=True)
        if not created:  # the directory was there but empty: leave it empty
            for name in os.listdir(path):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(path, name))
        raise
    return True


def _run_setup(
    exe: str,
    path: str,
    config: str,
    vmid: str,
    pwd: str | None,
    log: str,
    platform_cert: bool,
) -> int:
    cmd = [
        exe,
        "--tpm2",
        "--tpmstate",
        path,
        "--vmid",
        vmid,
        "--createek",
        "--create-ek-cert",
        "--lock-nvram",
        "--not-overwrite",
        "--config",
        config,
        "--logfile",
        log,
    ]
    if platform_cert:
        cmd.append("--create-platform-cert")
    if pwd is not None:
        cmd += ["--pwdfile", pwd, "--cipher", _CIPHER]
    try:
        return subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=_SETUP_TIMEOUT,
            check=False,
        ).returncode
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SwtpmSetupError(f"swtpm_setup could not run: {exc}")


def read_ek(
    path: str,
    ek_alg: str = "rsa",
    secret: bytes | None = None,
    swtpm: str = "swtpm",
) -> EkIdentity:
    """Read the EK and EK certificate of the state in ``path``.

    A copy of the state is served by a private swtpm on loopback ports and
    read with the same code (and EK selection) the guest agent uses.

    Raises:
        SwtpmSetupError: no state, or swtpm could not serve it.
    """
    if not has_state(path):
        raise SwtpmSetupError(f"no TPM 2.0 state in {path}")
    with tempfile.TemporaryDirectory(prefix="vtpm-ek-") as tmp:
        shutil.copy2(os.path.join(path, _STATE_FILE), tmp)
        with _password_file(secret) as pwd:
            for attempt in range(3):  # a probed port may be taken meanwhile
                port = _port_pair_below_ephemeral()
                proc = _start_swtpm(swtpm, tmp, port, pwd)
                try:
                    if not _wait_listening(proc, port):
                        if attempt < 2 and proc.poll() is not None:
                            continue
                        raise SwtpmSetupError(
                            f"swtpm could not serve the state of {path}: "
                            f"{_tail(os.path.join(tmp, 'swtpm.log'))}"
                        )
                    try:
                        with Tpm(f"swtpm:host=127.0.0.1,port={port}", ek_alg) as tpm:
                            return EkIdentity(tpm.ek_public(), tpm.ek_certificate())
                    except TpmError as exc:
                        raise SwtpmSetupError(f"cannot read the EK of {path}: {exc}")
                finally:
                    _stop(proc)
    raise SwtpmSetupError(f"swtpm could not serve the state of {path}")


def _port_pair_below_ephemeral() -> int:
    """Loopback ports P, P+1 free now and outside the kernel's ephemeral
    range (the EK is read on every ensure; see
    verifier.common.swtpm_localca.free_ports)."""
    try:
        return free_ports(2)
    except TpmError as exc:
        raise SwtpmSetupError(f"no free pair of loopback ports for swtpm: {exc}")


def _start_swtpm(
    exe: str, state: str, port: int, pwd: str | None
) -> subprocess.Popen[bytes]:
    cmd = [
        exe,
        "socket",
        "--tpm2",
        "--server",
        f"type=tcp,port={port},bindaddr=127.0.0.1",
        "--ctrl",
        f"type=tcp,port={port + 1},bindaddr=127.0.0.1",
        "--tpmstate",
        f"dir={state}",
        "--flags",
        "not-need-init,startup-clear",
        "--log",
        f"file={os.path.join(state, 'swtpm.log')}",
    ]
    if pwd is not None:
        cmd += ["--key", f"pwdfile={pwd},mode={_CIPHER}"]
    try:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as exc:
        raise SwtpmSetupError(f"swtpm could not start: {exc}")


def _wait_listening(proc: subprocess.Popen[bytes], port: int) -> bool:
    deadline = time.monotonic() + _START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.02)
    return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
