"""Nova 34 as separate processes on a real RabbitMQ bus, for integration tests.

:class:`NovaDeployment` brings up, each as its own process group: Placement
and the compute API (``wsgi_serve``), ``nova-conductor``,
``nova-scheduler`` and ``nova-compute`` (``fake.SmallFakeDriver``). They
share SQLite files as databases (API, cell0, cell1, placement) and a
scratch vhost on the machine's RabbitMQ; Glance and Neutron are the
:mod:`standins`. The API pipeline is the venv's ``api-paste.ini`` without
``authtoken``: callers send X-User-Id/X-Project-Id/X-Roles themselves.
"""

from __future__ import annotations

import configparser
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid as uuid_mod
from typing import Any

import requests
import sqlalchemy as sa

from trusted_testing import rabbit, services
from trusted_testing.cluster import die_with_parent, free_port, wait_port
from trusted_testing.nova.standins import StandIns

PROJECT_ID = "6f70656e737461636b20697320636f6f"
TENANT_HEADERS = {
    "X-User-Id": "tenant-user",
    "X-Project-Id": PROJECT_ID,
    "X-Roles": "reader,member",
    # Nova passes the caller's token on to Glance/Neutron (the stand-ins
    # ignore it); without one its clients refuse to call them at all
    "X-Auth-Token": "tenant-token",
}
ADMIN_HEADERS = {
    "X-User-Id": "admin",
    "X-Project-Id": PROJECT_ID,
    "X-Roles": "admin,reader,member",
    "X-Auth-Token": "admin-token",
}
_BIN = os.path.dirname(sys.executable)


def _tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def _write_ini(path: str, sections: dict[str, dict[str, Any]]) -> None:
    parser = configparser.RawConfigParser()
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    for name, options in sections.items():
        if name != "DEFAULT":
            parser.add_section(name)
        for key, value in options.items():
            parser.set(name, key, str(value))
    with open(path, "w", encoding="utf-8") as f:
        parser.write(f)


def _paste_without_authtoken(path: str) -> None:
    """The venv's api-paste.ini with ``authtoken`` dropped from each
    pipeline (``keystonecontext`` then trusts the X-* headers)."""
    source = os.path.join(sys.prefix, "etc", "nova", "api-paste.ini")
    with open(source, encoding="utf-8") as f:
        lines = f.read().splitlines()
    out = []
    for line in lines:
        if line.startswith("keystone =") and " authtoken " in line:
            line = line.replace(" authtoken ", " ")
        out.append(line)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")


class NovaDeployment:
    """Start with :meth:`start`, always :meth:`stop` (also after a failure)."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.host = f"trusted-mp-{uuid_mod.uuid4().hex[:8]}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.vhost: str | None = None
        self.transport_url = ""
        self.standins = StandIns()
        self.api_url = ""
        self.placement_url = ""
        self.bring_up_seconds = 0.0
        # MariaDB databases by Nova database name (empty: SQLite files)
        self._mariadb: dict[str, str] = {}
        self._use_mariadb = services.missing_mariadb() is None

    # -- life cycle -----------------------------------------------------------

    def start(self) -> None:
        begin = time.monotonic()
        problem = rabbit.missing()
        if problem:
            raise RuntimeError(f"multi-process Nova needs {problem}")
        self.transport_url, self.vhost = rabbit.scratch_vhost()
        self.standins.start()
        self._write_config()
        self._run(
            "placement-manage",
            "--config-file",
            os.path.join(self.workdir, "placement.conf"),
            "db",
            "sync",
        )
        self._manage("api_db", "sync")
        self._manage("cell_v2", "map_cell0", "--database_connection", self._db("cell0"))
        self._manage("cell_v2", "create_cell", "--name", "cell1", "--verbose")
        self._manage("db", "sync")
        self._serve("placement", self._placement_env())
        for service in ("conductor", "scheduler"):
            self._spawn(f"nova-{service}", self._service_argv(service))
        self._start_computes()
        self._serve("nova", self._nova_env())
        for host in self.compute_host_names():
            self._wait_for_compute_node(host)
        self._manage("cell_v2", "discover_hosts", "--verbose")
        self._create_flavor()
        self.bring_up_seconds = time.monotonic() - begin

    def stop(self) -> None:
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            # what the leader left in its group goes too: an emulated compute
            # host's libvirtd outlived its nova-compute (and SIGTERM) before
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        self.procs.clear()
        self.standins.stop()
        if self.vhost:
            rabbit.drop_vhost(self.vhost)
            self.vhost = None
        for db_name in self._mariadb.values():
            services.drop_mariadb(db_name)
        self._mariadb.clear()

    # -- configuration ----------------------------------------------------------

    def _db(self, name: str) -> str:
        """Nova's database ``name``: a scratch MariaDB database when the
        machine runs MariaDB (as devstack deploys Nova), else a SQLite file.

        SQLite serves one writer: under load the conductor's write of a
        failed build could meet "database is locked" at once (a reader's
        lock that must be upgraded is refused without waiting) and leave
        the instance in BUILD. PostgreSQL through psycopg 3 hands Nova INET
        columns as ipaddress objects, which Nova's objects (netaddr) refuse.
        """
        if self._use_mariadb:
            if name not in self._mariadb:
                _, self._mariadb[name] = services.scratch_mariadb()
            return f"mysql+pymysql://root@127.0.0.1:3306/{self._mariadb[name]}"
        # several Nova processes write one file: wait for a lock (pysqlite's
        # timeout, seconds) where waiting helps
        path = os.path.join(self.workdir, f"{name}.sqlite")
        return f"sqlite:///{path}?timeout=60"

    def _write_config(self) -> None:
        w = self.workdir
        self.api_port, self.placement_port = free_port(), free_port()
        self.api_url = f"http://127.0.0.1:{self.api_port}/v2.1"
        self.placement_url = f"http://127.0.0.1:{self.placement_port}"
        self.conf = os.path.join(w, "nova.conf")
        paste = os.path.join(w, "api-paste.ini")
        _paste_without_authtoken(paste)
        stand_in = self.standins.url
        service_auth = {
            "auth_type": "admin_token",
            "token": "admin",
        }
        _write_ini(
            self.conf,
            {
                "DEFAULT": {
                    "host": self.host,
                    "transport_url": self.transport_url,
                    "compute_driver": "fake.SmallFakeDriver",
                    "state_path": w,
                    "instances_path": os.path.join(w, "instances"),
                    "my_ip": "127.0.0.1",
                    "debug": "true",
                    "use_stderr": "true",
                },
                "api_database": {"connection": self._db("api")},
                "database": {"connection": self._db("cell1")},
                "wsgi": {"api_paste_config": paste},
                "conductor": {"workers": 1},
                "scheduler": {"workers": 1},
                "notifications": {"notification_format": "versioned"},
                "oslo_messaging_notifications": {"driver": "messagingv2"},
                "oslo_concurrency": {"lock_path": os.path.join(w, "locks")},
                "placement": {
                    **service_auth,
                    "endpoint": self.placement_url,
                    "endpoint_override": self.placement_url,
                },
                "glance": {"api_servers": stand_in},
                "neutron": {
                    **service_auth,
                    "endpoint": stand_in,
                    "endpoint_override": stand_in,
                },
            },
        )
        _write_ini(
            os.path.join(w, "placement.conf"),
            {
                "DEFAULT": {"debug": "true", "use_stderr": "true"},
                "placement_database": {"connection": self._db("placement")},
                "api": {"auth_strategy": "noauth2"},
            },
        )

    def _placement_env(self) -> dict[str, str]:
        return dict(os.environ, OS_PLACEMENT_CONFIG_DIR=self.workdir)

    def _nova_env(self) -> dict[str, str]:
        return dict(
            os.environ,
            OS_NOVA_CONFIG_DIR=self.workdir,
            OS_NOVA_CONFIG_FILES="api-paste.ini;nova.conf",
        )

    # -- processes ----------------------------------------------------------------

    def log(self, name: str) -> str:
        return os.path.join(self.workdir, f"{name}.log")

    def _run(self, *argv: str, env: dict[str, str] | None = None) -> str:
        proc = subprocess.run(
            [os.path.join(_BIN, argv[0]), *argv[1:]],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            preexec_fn=die_with_parent,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} failed ({proc.returncode}):\n"
                + (proc.stdout + proc.stderr)[-4000:]
            )
        return proc.stdout

    def _service_argv(self, service: str) -> list[str]:
        """How to run ``nova-<service>`` (a variant may wrap nova-compute)."""
        return [os.path.join(_BIN, f"nova-{service}"), "--config-file", self.conf]

    def _start_computes(self) -> None:
        """Start ``nova-compute`` (a variant may run several)."""
        self._spawn("nova-compute", self._service_argv("compute"))

    def compute_host_names(self) -> list[str]:
        """The ``[DEFAULT] host`` of each nova-compute."""
        return [self.host]

    def _manage(self, *argv: str) -> str:
        return self._run("nova-manage", "--config-file", self.conf, *argv)

    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with open(self.log(name), "wb") as out:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, killed as one
                preexec_fn=die_with_parent,
            )
        self.procs[name] = proc
        return proc

    def _serve(self, which: str, env: dict[str, str]) -> None:
        port = self.api_port if which == "nova" else self.placement_port
        name = "nova-api" if which == "nova" else "placement-api"
        proc = self._spawn(
            name,
            [sys.executable, "-m", "trusted_testing.nova.wsgi_serve"]
            + [str(port), which],
            env,
        )
        wait_port(port, proc, self.log(name), timeout=120)

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited ({proc.returncode}):\n{_tail(self.log(name))}"
                )

    def _wait_for_compute_node(self, host: str, timeout: float = 180.0) -> None:
        engine = sa.create_engine(self._db("cell1"))
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                self._check_alive()
                with engine.connect() as conn:
                    rows = conn.execute(
                        sa.text("SELECT count(*) FROM compute_nodes WHERE host = :h"),
                        {"h": host},
                    ).scalar()
                if rows:
                    return
                time.sleep(0.5)
        finally:
            engine.dispose()
        raise RuntimeError(
            f"nova-compute of {host} never registered its node:\n"
            + "".join(_tail(self.log(name)) for name in self.procs if "compute" in name)
        )

    # -- API helpers ----------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        admin: bool = False,
        microversion: str = "2.1",
        **kwargs: Any,
    ) -> requests.Response:
        headers = dict(ADMIN_HEADERS if admin else TENANT_HEADERS)
        headers["OpenStack-API-Version"] = f"compute {microversion}"
        return requests.request(
            method, self.api_url + path, headers=headers, timeout=60, **kwargs
        )

    def _create_flavor(self) -> None:
        body = {
            "flavor": {
                "name": "trusted.small",
                "id": "trusted-small",
                "ram": 512,
                "vcpus": 1,
                "disk": 1,
            }
        }
        resp = self.request("POST", "/flavors", admin=True, json=body)
        if resp.status_code != 200:
            raise RuntimeError(f"creating the flavor: {resp.status_code} {resp.text}")

    def server(self, uuid: str) -> dict[str, Any] | None:
        resp = self.request("GET", f"/servers/{uuid}", admin=True, microversion="2.3")
        if resp.status_code == 404:
            return None
        resp.raise_for_status()
        return dict(resp.json()["server"])
