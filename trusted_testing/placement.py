"""A standalone Placement 16 for functional tests and benchmarks.

The real ``placement-api`` WSGI application (``placement.wsgi``) served by
:mod:`trusted_testing.nova.wsgi_serve` on a free loopback port, on a SQLite
database made by ``placement-manage db sync``, without authtoken
(``auth_strategy = noauth2``: callers send ``X-Auth-Token: admin`` and
``X-Roles``), as :class:`trusted_testing.nova.deploy.NovaDeployment` serves
it. It can be stopped and started again on the same port and database (a
Placement outage), and creates resource providers through its own API.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid as uuid_mod
from collections.abc import Sequence
from typing import Any

import requests

from trusted_testing.procs import die_with_parent, wait_port
from trusted_testing.swtpm import free_ports

__all__ = ["ADMIN_HEADERS", "StandalonePlacement"]

ADMIN_HEADERS = {
    "X-Auth-Token": "admin",
    "X-Roles": "admin,service",
    "OpenStack-API-Version": "placement 1.39",
}
_BIN = os.path.dirname(sys.executable)


class StandalonePlacement:
    """Placement on ``127.0.0.1:port`` with its database in ``workdir``.

    Args:
        workdir: a scratch directory (config, SQLite file, log).
    """

    def __init__(self, workdir: str) -> None:
        os.makedirs(workdir, exist_ok=True)
        self.workdir = workdir
        self.port = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = os.path.join(workdir, "placement-api.log")
        self._proc: subprocess.Popen[bytes] | None = None
        conf = os.path.join(workdir, "placement.conf")
        database = os.path.join(workdir, "placement.sqlite")
        with open(conf, "w", encoding="utf-8") as f:
            f.write(
                "[DEFAULT]\nuse_stderr = true\n"
                "[api]\nauth_strategy = noauth2\n"
                f"[placement_database]\nconnection = sqlite:///{database}\n"
            )
        subprocess.run(
            [
                os.path.join(_BIN, "placement-manage"),
                "--config-file",
                conf,
                "db",
                "sync",
            ],
            check=True,
            capture_output=True,
            timeout=300,
            preexec_fn=die_with_parent,
        )

    @property
    def running(self) -> bool:
        """Whether it serves now."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Serve (again) on the same port and database; a no-op if it does."""
        if self.running:
            return
        env = dict(os.environ, OS_PLACEMENT_CONFIG_DIR=self.workdir)
        with open(self.log, "ab") as out:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "trusted_testing.nova.wsgi_serve"]
                + [str(self.port), "placement"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        wait_port(self.port, self._proc, self.log, timeout=120)
        self.request("GET", "/")  # the application answers, not just the socket

    def stop(self) -> None:
        """Stop serving (the database stays)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    # -- the API, as an operator or Nova would call it ------------------------

    def request(
        self, method: str, path: str, body: Any = None, expect: tuple[int, ...] = ()
    ) -> requests.Response:
        """One admin request; ``expect``: the statuses that are not a failure."""
        response = requests.request(
            method, self.url + path, json=body, headers=ADMIN_HEADERS, timeout=30
        )
        if expect and response.status_code not in expect:
            raise RuntimeError(
                f"{method} {path}: {response.status_code} {response.text[:300]}"
            )
        return response

    def create_provider(self, name: str, traits: Sequence[str] = ()) -> str:
        """A new resource provider named ``name`` carrying ``traits`` (custom
        ones are created); returns its UUID."""
        provider = str(uuid_mod.uuid4())
        self.request(
            "POST", "/resource_providers", {"name": name, "uuid": provider}, (200,)
        )
        if traits:
            self.set_traits(provider, list(traits))
        return provider

    def traits(self, provider: str) -> tuple[int, set[str]]:
        """The provider's generation and traits."""
        data = self.request(
            "GET", f"/resource_providers/{provider}/traits", expect=(200,)
        ).json()
        return data["resource_provider_generation"], set(data["traits"])

    def set_traits(self, provider: str, traits: list[str]) -> int:
        """Replace the provider's traits (another writer); returns the new
        generation."""
        for trait in traits:
            if trait.startswith("CUSTOM_"):
                self.request("PUT", f"/traits/{trait}", expect=(201, 204))
        generation, _ = self.traits(provider)
        body = {"resource_provider_generation": generation, "traits": sorted(traits)}
        data = self.request(
            "PUT", f"/resource_providers/{provider}/traits", body, (200,)
        ).json()
        return int(data["resource_provider_generation"])
