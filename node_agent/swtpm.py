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
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from types import TracebackType

from node_agent.exceptions import TpmError

_HOST = "127.0.0.1"
_STATE_FILE = "tpm2-00.permall"
_SETUP_CONF = "swtpm_setup.conf"
_LOCALCA_CONF = "swtpm-localca.conf"
_LOCALCA_OPTIONS = "swtpm-localca.options"
_ISSUER_CERT = "issuercert.pem"
_ROOT_CERT = "swtpm-localca-rootca-cert.pem"
_SETUP_TIMEOUT = 120.0
_START_TIMEOUT = 10.0
_STOP_TIMEOUT = 5.0
_LOG_TAIL = 2000
EK_ALGS = ("rsa", "ecc")


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int = 1) -> int:
    """Find a TCP port P such that P .. P + count - 1 are free on 127.0.0.1.

    The ports are chosen at random *below* the kernel's ephemeral range: a
    port probed with ``bind(0)`` and released comes from that range, where
    any outgoing connection or other ``bind(0)`` on the machine may take it
    before the service binds it (seen as flaky tests when several suites
    run at once). Ports are only probed, not reserved.

    Returns:
        The port P.

    Raises:
        TpmError: If no free run of ports was found.
    """
    top = max(_ephemeral_low() - count, 10001)
    for _ in range(200):
        port = random.randrange(10000, top)  # noqa: S311 (not a secret)
        sockets = [
            socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)
        ]
        try:
            for i, sock in enumerate(sockets):
                sock.bind((_HOST, port + i))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        return port
    raise TpmError(f"no {count} free consecutive TCP ports found on {_HOST}")


def free_port_pair() -> int:
    """A port P such that P and P + 1 are free (swtpm's server and control
    ports); see :func:`free_ports`."""
    return free_ports(2)


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


def _write_atomic(path: str, content: str) -> None:
    """Write ``content`` to ``path`` through a temporary file and a rename."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(content)
    os.replace(tmp, path)


def write_localca_config(localca_dir: str) -> str:
    """Write swtpm_setup and swtpm_localca configuration into ``localca_dir``.

    Args:
        localca_dir: Directory holding the local CA; created if missing.

    Returns:
        The path of the swtpm_setup configuration file to pass to ``--config``.
    """
    ca_dir = os.path.abspath(localca_dir)
    os.makedirs(ca_dir, exist_ok=True)
    localca_conf = os.path.join(ca_dir, _LOCALCA_CONF)
    options = os.path.join(ca_dir, _LOCALCA_OPTIONS)
    setup_conf = os.path.join(ca_dir, _SETUP_CONF)
    _write_atomic(
        localca_conf,
        f"statedir = {ca_dir}\n"
        f"signingkey = {os.path.join(ca_dir, 'signkey.pem')}\n"
        f"issuercert = {os.path.join(ca_dir, _ISSUER_CERT)}\n"
        f"certserial = {os.path.join(ca_dir, 'certserial')}\n",
    )
    _write_atomic(
        options,
        "--platform-manufacturer TrustedCloud\n"
        "--platform-version 2.1\n"
        "--platform-model swtpm\n",
    )
    _write_atomic(
        setup_conf,
        f"create_certs_tool = {shutil.which('swtpm_localca') or 'swtpm_localca'}\n"
        f"create_certs_tool_config = {localca_conf}\n"
        f"create_certs_tool_options = {options}\n"
        "active_pcr_banks = sha256\n",
    )
    return setup_conf


def ek_ca_bundle(localca_dir: str) -> bytes:
    """Return the PEM CA certificates that sign EK certificates.

    Args:
        localca_dir: The local CA directory used by :class:`Swtpm`.

    Returns:
        The issuer (intermediate) certificate followed by the root CA
        certificate when there is one, PEM encoded.

    Raises:
        TpmError: If the local CA has not been created yet.
    """
    bundle = b""
    for name in (_ISSUER_CERT, _ROOT_CERT):
        path = os.path.join(localca_dir, name)
        try:
            with open(path, "rb") as pem:
                data = pem.read()
        except FileNotFoundError:
            if name == _ISSUER_CERT:
                raise TpmError(f"ek_ca_bundle: no local CA in {localca_dir}")
            continue
        bundle += data if data.endswith(b"\n") else data + b"\n"
    return bundle


class Swtpm:
    """One swtpm TPM 2.0 emulator process listening on 127.0.0.1.

    Args:
        state_dir: Directory of the TPM state and of the log files.
        port: TCP command port; ``port + 1`` is the control port.
        localca_dir: Directory of the private local CA signing EK certificates.
        ek_alg: ``"rsa"`` or ``"ecc"``; with ``"ecc"`` swtpm_setup is given
            ``--ecc``. swtpm_setup always creates an RSA 2048 and an ECC
            NIST P-384 EK with certificates in either case.
    """

    def __init__(
        self, state_dir: str, port: int, localca_dir: str, ek_alg: str = "rsa"
    ) -> None:
        if ek_alg not in EK_ALGS:
            raise TpmError(f"Swtpm: unsupported ek_alg {ek_alg!r}")
        self.state_dir = os.path.abspath(state_dir)
        self.port = port
        self.localca_dir = os.path.abspath(localca_dir)
        self.ek_alg = ek_alg
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
            "not-need-init,startup-clear",
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
