"""A private PostgreSQL cluster for crash tests.

The machine-wide PostgreSQL (127.0.0.1:5432) is shared and must never be
killed, so a test that crashes the database runs its own: ``initdb`` in a
temporary directory, ``postgres`` on a free loopback port with a private
socket directory. :meth:`PrivatePostgres.kill` SIGKILLs the postmaster and
every backend (its process group), as a power cut or the OOM killer would;
:meth:`PrivatePostgres.start` brings it back on the same data directory,
where PostgreSQL's own crash recovery replays the WAL: what was committed
is there, what was not is gone.

PostgreSQL refuses to run as root; as root the cluster runs as the
``postgres`` user of the Debian package.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time

from trusted_testing.cluster import die_with_parent, free_port
from trusted_testing.procs import kill_group, listening

__all__ = ["PrivatePostgres", "missing"]


def _bindir() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    return os.path.dirname(found[-1]) if found else None


def missing() -> str | None:
    """What is missing to run a private cluster here, or None."""
    if _bindir() is None:
        return "PostgreSQL server binaries (apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "the postgres user (apt-get install postgresql)"
    return None


class PrivatePostgres:
    """One PostgreSQL cluster on a free port, trust authentication over
    loopback, one database ``trusted``.

    Attributes:
        port: its TCP port on 127.0.0.1.
        url: the SQLAlchemy URL of the ``trusted`` database.
    """

    def __init__(self) -> None:
        bindir = _bindir()
        if bindir is None:
            raise RuntimeError(str(missing()))
        self._bin = bindir
        self.port = free_port()
        self._dir = tempfile.mkdtemp(prefix="trusted-pg-")
        os.chmod(self._dir, 0o755)
        self._data = os.path.join(self._dir, "data")
        self._sockets = os.path.join(self._dir, "run")
        self.log = os.path.join(self._dir, "postgres.log")
        self._user: str | None = None
        if os.geteuid() == 0:
            self._user = "postgres"
            entry = pwd.getpwnam("postgres")
            for path in (self._dir,):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/trusted"
        self._proc: subprocess.Popen[bytes] | None = None
        self._run([f"{self._bin}/initdb", "-D", self._data, "-U", "postgres",
                   "-A", "trust", "-E", "UTF8", "--no-locale"])  # fmt: skip
        os.makedirs(self._sockets, exist_ok=True)
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self._sockets, entry.pw_uid, entry.pw_gid)
        self.start()
        self._run([f"{self._bin}/createdb", "-h", "127.0.0.1", "-p", str(self.port),
                   "-U", "postgres", "trusted"])  # fmt: skip

    def _run(self, argv: list[str]) -> None:
        proc = subprocess.run(
            argv, user=self._user, capture_output=True, text=True, timeout=120
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {proc.stderr[-2000:]}")

    def start(self, timeout: float = 60.0) -> None:
        """Start (or restart after a crash) and wait for connections."""
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(
                [
                    f"{self._bin}/postgres",
                    "-D",
                    self._data,
                    "-p",
                    str(self.port),
                    "-k",
                    self._sockets,
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "max_connections=100",
                ],  # fmt: skip
                stdout=log,
                stderr=subprocess.STDOUT,
                user=self._user,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                with open(self.log, encoding="utf-8", errors="replace") as f:
                    raise RuntimeError(f"postgres exited: {f.read()[-2000:]}")
            if listening(self.port) and self._ready():
                return
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"postgres did not start in {timeout} s; see {self.log}")

    def _ready(self) -> bool:
        proc = subprocess.run(
            [f"{self._bin}/pg_isready", "-h", "127.0.0.1", "-p", str(self.port)],
            capture_output=True,
            timeout=30,
        )
        return proc.returncode == 0

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend (a crash)."""
        kill_group(self._proc, self.port)
        self._proc = None

    def cleanup(self) -> None:
        """Kill the cluster and remove its files."""
        self.kill()
        shutil.rmtree(self._dir, ignore_errors=True)
