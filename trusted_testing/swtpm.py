"""Manage a real swtpm TPM 2.0 emulator process for tests, demos and benchmarks.

The TPM state is manufactured once with ``swtpm_setup`` (EK key pairs, EK
certificates and, when supported, a platform certificate). Certificates are
signed by a private local CA (``swtpm_localca``) whose configuration, keys,
certificates and serial number all live in a caller-chosen ``localca_dir``;
the system-wide ``/etc/swtpm-localca.conf`` and ``/var/lib/swtpm-localca`` are
never used.

On first use ``swtpm_localca`` creates, inside ``localca_dir``:

* ``swtpm-localca-rootca-privkey.pem`` / ``swtpm-localca-rootca-cert.pem``:
  a self-signed root CA;
* ``signkey.pem`` / ``issuercert.pem``: the intermediate CA that signs the EK
  and platform certificates;
* ``certserial``: the serial number of the next certificate;
* ``.lock.swtpm-localca``: a lock file, so several TPMs may share one CA.

Then ``swtpm socket`` serves the TPM over TCP on ``port`` (commands) and
``port + 1`` (control channel).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from types import TracebackType

from verifier.common.errors import TpmError
from verifier.common.swtpm_localca import (
    ek_ca_bundle,
    free_port_pair,
    free_ports,
    write_localca_config,
)

__all__ = [
    "EK_ALGS",
    "Swtpm",
    "ek_ca_bundle",
    "free_port_pair",
    "free_ports",
    "write_localca_config",
]

_HOST = "127.0.0.1"
_STATE_FILE = "tpm2-00.permall"
_SETUP_TIMEOUT = 120.0
_START_TIMEOUT = 10.0
_STOP_TIMEOUT = 5.0
_LOG_TAIL = 2000
EK_ALGS = ("rsa", "ecc")


def _port_free(port: int) -> bool:
    """Whether nothing listens on ``port`` (TIME_WAIT sockets do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((_HOST, port))
        except OSError:
            return False
    return True


def _tail(path: str, limit: int = _LOG_TAIL) -> str:
    """Return the last ``limit`` characters of a text file, or '' if unreadable."""
    try:
        with open(path, encoding="utf-8", errors="replace") as log:
            return log.read()[-limit:]
    except OSError:
        return ""


class Swtpm:
    """One swtpm TPM 2.0 emulator process listening on 127.0.0.1.

    Args:
        state_dir: Directory of the TPM state and of the log files.
        port: TCP command port; ``port + 1`` is the control port.
        localca_dir: Directory of the private local CA signing EK certificates.
        ek_alg: ``"rsa"`` or ``"ecc"``; with ``"ecc"`` swtpm_setup is given
            ``--ecc``. swtpm_setup always creates an RSA 2048 and an ECC
            NIST P-384 EK with certificates in either case.
        startup_clear: swtpm sends ``TPM2_Startup(CLEAR)`` itself when it
            starts; False leaves that to the caller, who may first run an
            H-CRTM sequence (:meth:`hash_sequence`) as a platform does.
        pcr_banks: the PCR banks active when the TPM is manufactured
            (``swtpm_setup --pcr-banks``, e.g. ``"sha1,sha256"``); default
            the local CA configuration's (sha256 only).
    """

    def __init__(
        self,
        state_dir: str,
        port: int,
        localca_dir: str,
        ek_alg: str = "rsa",
        *,
        startup_clear: bool = True,
        pcr_banks: str | None = None,
    ) -> None:
        if ek_alg not in EK_ALGS:
            raise TpmError(f"Swtpm: unsupported ek_alg {ek_alg!r}")
        self.state_dir = os.path.abspath(state_dir)
        self.port = port
        self.localca_dir = os.path.abspath(localca_dir)
        self.ek_alg = ek_alg
        self.startup_clear = startup_clear
        self.pcr_banks = pcr_banks
        self.log_path = os.path.join(self.state_dir, "swtpm.log")
        self.setup_log_path = os.path.join(self.state_dir, "swtpm_setup.log")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def tcti(self) -> str:
        """The TCTI configuration string to reach this TPM."""
        return f"swtpm:host={_HOST},port={self.port}"

    @property
    def running(self) -> bool:
        """Whether the swtpm child process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @staticmethod
    def ek_ca_bundle(localca_dir: str) -> bytes:
        """Return the PEM CA certificates that sign EK certificates.

        See the module function :func:`ek_ca_bundle`.
        """
        return ek_ca_bundle(localca_dir)

    def has_state(self) -> bool:
        """Whether the TPM state has already been manufactured."""
        return os.path.exists(os.path.join(self.state_dir, _STATE_FILE))

    def setup(self) -> None:
        """Manufacture the TPM state with swtpm_setup if there is none yet.

        Raises:
            TpmError: If swtpm_setup fails.
        """
        if self.has_state():
            return
        os.makedirs(self.state_dir, exist_ok=True)
        config = write_localca_config(self.localca_dir)
        result = self._run_setup(config, platform_cert=True)
        if result.returncode != 0:
            result = self._run_setup(config, platform_cert=False)
        if result.returncode != 0:
            raise TpmError(
                f"swtpm_setup failed with exit code {result.returncode}: "
                f"{_tail(self.setup_log_path)}"
            )

    def _run_setup(
        self, config: str, platform_cert: bool
    ) -> subprocess.CompletedProcess[bytes]:
        """Run swtpm_setup once, appending its output to the setup log."""
        cmd = [
            "swtpm_setup",
            "--tpm2",
            "--tpmstate",
            self.state_dir,
            "--create-ek-cert",
            "--config",
            config,
            "--overwrite",
        ]
        if platform_cert:
            cmd.append("--create-platform-cert")
        if self.ek_alg == "ecc":
            cmd.append("--ecc")
        if self.pcr_banks:
            cmd += ["--pcr-banks", self.pcr_banks]
        with open(self.setup_log_path, "ab") as log:
            try:
                return subprocess.run(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=_SETUP_TIMEOUT,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise TpmError(f"swtpm_setup could not run: {exc}")

    def start(self) -> None:
        """Manufacture the state if needed, start swtpm and wait for its port.

        Raises:
            TpmError: If swtpm_setup fails or swtpm does not come up in time.
        """
        if self.running:
            return
        self.setup()
        for port in (self.port, self.port + 1):
            if not _port_free(port):
                raise TpmError(f"swtpm cannot start: port {_HOST}:{port} is in use")
        cmd = [
            "swtpm",
            "socket",
            "--tpm2",
            "--server",
            f"type=tcp,port={self.port},bindaddr={_HOST}",
            "--ctrl",
            f"type=tcp,port={self.port + 1},bindaddr={_HOST}",
            "--tpmstate",
            f"dir={self.state_dir}",
            "--flags",
            "not-need-init,startup-clear" if self.startup_clear else "not-need-init",
        ]
        with open(self.log_path, "ab") as log:
            try:
                self._proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                raise TpmError(f"swtpm could not start: {exc}")
        self._wait_for_port()

    def _wait_for_port(self) -> None:
        """Block until the command port accepts connections."""
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if not self.running:
                code = self._proc.returncode if self._proc else None
                self._proc = None
                raise TpmError(f"swtpm exited with code {code}: {_tail(self.log_path)}")
            try:
                with socket.create_connection((_HOST, self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TpmError(
            f"swtpm did not listen on {_HOST}:{self.port} within "
            f"{_START_TIMEOUT:.0f} s: {_tail(self.log_path)}"
        )

    def _ioctl(self, *args: str, data: bytes | None = None) -> None:
        cmd = ["swtpm_ioctl", "--tcp", f"{_HOST}:{self.port + 1}", *args]
        try:
            result = subprocess.run(
                cmd, input=data, capture_output=True, timeout=_SETUP_TIMEOUT
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TpmError(f"swtpm_ioctl could not run: {exc}")
        if result.returncode != 0:
            raise TpmError(
                f"swtpm_ioctl {' '.join(args)} failed: "
                f"{result.stderr.decode(errors='replace').strip()}"
            )

    def hash_sequence(self, data: bytes) -> None:
        """Run an H-CRTM sequence (``_TPM_Hash_Start``, ``_TPM_Hash_Data``,
        ``_TPM_Hash_End``) over ``data``, before ``TPM2_Startup``: PCR 0 of
        every bank becomes ``H(00..04 || H(data))``.

        Raises:
            TpmError: swtpm_ioctl failed.
        """
        self._ioctl("-h", "-", data=data)

    def stop(self) -> None:
        """Terminate swtpm (SIGTERM, then SIGKILL after a timeout) and reap it."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> Swtpm:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
