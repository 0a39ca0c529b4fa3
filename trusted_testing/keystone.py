"""A real Keystone (PyPI ``keystone``, SQLite, fernet tokens) for tests.

``Keystone(work_dir).start()`` writes a ``keystone.conf``, runs
``keystone-manage db_sync``, ``fernet_setup``, ``credential_setup`` and
``bootstrap`` (an ``admin`` user with the ``admin`` role on project
``admin``, and the ``reader``/``member``/``admin`` roles with their
implications), then serves Keystone's own WSGI application
(``keystone.wsgi.api``) with werkzeug on a loopback port in a child
process. :meth:`Keystone.add_project` makes a project with users holding
given roles; :meth:`Keystone.token` gets a project-scoped token.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

from trusted_testing.procs import die_with_parent, wait_port

__all__ = ["Keystone", "KeystoneUser"]

ADMIN_PASSWORD = "admin-secret"

_SERVE = """
import os
import sys
port = int(os.environ["TRUSTED_KEYSTONE_PORT"])
sys.argv = sys.argv[:1]  # keystone parses the command line as its own
from werkzeug.serving import run_simple
from keystone.wsgi.api import application
run_simple("127.0.0.1", port, application, threaded=True)
"""


@dataclasses.dataclass(frozen=True)
class KeystoneUser:
    """A user with roles on one project."""

    name: str
    password: str
    user_id: str
    project_name: str
    project_id: str


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Keystone:
    """One Keystone process on loopback, its state under ``work_dir``."""

    def __init__(self, work_dir: str) -> None:
        self.work_dir = work_dir
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._admin_token: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v3"

    @property
    def conf_file(self) -> str:
        return os.path.join(self.work_dir, "keystone.conf")

    def _env(self) -> dict[str, str]:
        return dict(
            os.environ,
            OS_KEYSTONE_CONFIG_FILES=self.conf_file,
            OS_NOVA_DISABLE_EVENTLET_PATCHING="1",
        )

    def _write_conf(self) -> None:
        os.makedirs(self.work_dir, exist_ok=True)
        keys = os.path.join(self.work_dir, "fernet-keys")
        creds = os.path.join(self.work_dir, "credential-keys")
        db = os.path.join(self.work_dir, "keystone.sqlite")
        with open(self.conf_file, "w") as f:
            f.write(
                "[DEFAULT]\nuse_stderr = true\n"
                f"[database]\nconnection = sqlite:///{db}\n"
                # one Keystone serves a test worker's classes for its whole
                # run, which may pass the default hour of a token
                "[token]\nprovider = fernet\nexpiration = 86400\n"
                f"[fernet_tokens]\nkey_repository = {keys}\n"
                f"[credential]\nkey_repository = {creds}\n"
            )

    def _manage(self, *args: str) -> None:
        manage = os.path.join(os.path.dirname(sys.executable), "keystone-manage")
        argv = [manage, "--config-file", self.conf_file, *args]
        result = subprocess.run(
            argv, env=self._env(), capture_output=True, timeout=300, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"keystone-manage {args[0]} failed: {result.stderr.decode()[-2000:]}"
            )

    def start(self) -> None:
        """Set up the database and keys, bootstrap, and serve."""
        self._write_conf()
        self._manage("db_sync")
        self._manage(
            "fernet_setup",
            "--keystone-user",
            str(os.getuid()),
            "--keystone-group",
            str(os.getgid()),
        )
        self._manage(
            "credential_setup",
            "--keystone-user",
            str(os.getuid()),
            "--keystone-group",
            str(os.getgid()),
        )
        self._manage(
            "bootstrap",
            "--bootstrap-password", ADMIN_PASSWORD,
            "--bootstrap-public-url", f"http://127.0.0.1:{self.port}/v3",
            "--bootstrap-internal-url", f"http://127.0.0.1:{self.port}/v3",
            "--bootstrap-region-id", "RegionOne",
        )  # fmt: skip
        log = os.path.join(self.work_dir, "keystone.log")
        with open(os.path.join(self.work_dir, "serve.py"), "w") as f:
            f.write(_SERVE)
        argv = [sys.executable, os.path.join(self.work_dir, "serve.py")]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv,
                env=dict(self._env(), TRUSTED_KEYSTONE_PORT=str(self.port)),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,  # noqa: PLW1509
            )
        wait_port(self.port, self.proc, log, timeout=120.0)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.proc = None

    def authtoken_options(
        self, username: str = "attestation", project: str = "service"
    ) -> dict[str, Any]:
        """``[keystone_authtoken]`` of a service process behind this
        Keystone, as service user ``username`` (password
        ``<username>-secret``, as :meth:`add_user` makes it)."""
        return {
            "www_authenticate_uri": self.url,
            "auth_url": self.url,
            "auth_type": "password",
            "username": username,
            "password": f"{username}-secret",
            "project_name": project,
            "user_domain_id": "default",
            "project_domain_id": "default",
            "service_token_roles_required": True,
            "interface": "public",
        }

    # -- REST helpers (Keystone's v3 API, as an administrator) ------------

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        token: str | None = None,
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """One call to Keystone: (status, JSON body, headers)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if token is not None:
            req.add_header("X-Auth-Token", token)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else {}, dict(resp.headers)
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, json.loads(raw) if raw else {}, dict(exc.headers)

    def token(self, user: str, password: str, project: str) -> str:
        """A project-scoped token (domain ``default``)."""
        body = {
            "auth": {
                "identity": {
                    "methods": ["password"],
                    "password": {
                        "user": {
                            "name": user,
                            "domain": {"id": "default"},
                            "password": password,
                        }
                    },
                },
                "scope": {"project": {"name": project, "domain": {"id": "default"}}},
            }
        }
        status, _, headers = self.request("POST", "/auth/tokens", body)
        if status != 201:
            raise RuntimeError(f"token for {user}@{project}: HTTP {status}")
        return headers["X-Subject-Token"]

    def revoke_token(self, token: str) -> None:
        """Revoke ``token`` (``DELETE /v3/auth/tokens``, as the admin)."""
        req = urllib.request.Request(self.url + "/auth/tokens", method="DELETE")
        req.add_header("X-Auth-Token", self.admin_token())
        req.add_header("X-Subject-Token", token)
        with urllib.request.urlopen(req, timeout=60) as resp:
            if resp.status != 204:
                raise RuntimeError(f"revoke token: HTTP {resp.status}")

    def admin_token(self) -> str:
        if self._admin_token is None:
            self._admin_token = self.token("admin", ADMIN_PASSWORD, "admin")
        return self._admin_token

    def _create(self, kind: str, body: dict[str, Any]) -> str:
        status, data, _ = self.request(
            "POST", f"/{kind}s", {kind: body}, self.admin_token()
        )
        if status != 201:
            raise RuntimeError(f"create {kind}: HTTP {status} {data}")
        return str(data[kind]["id"])

    def role_id(self, name: str) -> str:
        status, data, _ = self.request(
            "GET", f"/roles?name={name}", token=self.admin_token()
        )
        roles = data.get("roles", [])
        if status != 200 or not roles:
            return self._create("role", {"name": name})
        return str(roles[0]["id"])

    def project_id(self, name: str) -> str:
        status, data, _ = self.request(
            "GET", f"/projects?name={name}", token=self.admin_token()
        )
        if status != 200 or not data.get("projects"):
            raise RuntimeError(f"no project {name}: HTTP {status}")
        return str(data["projects"][0]["id"])

    def add_project(self, name: str) -> str:
        return self._create("project", {"name": name, "domain_id": "default"})

    def add_user(
        self, name: str, project: str, project_id: str, roles: list[str]
    ) -> KeystoneUser:
        """A user named ``name`` with ``roles`` on ``project``."""
        password = f"{name}-secret"
        user_id = self._create(
            "user", {"name": name, "password": password, "domain_id": "default"}
        )
        for role in roles:
            status, data, _ = self.request(
                "PUT",
                f"/projects/{project_id}/users/{user_id}/roles/{self.role_id(role)}",
                token=self.admin_token(),
            )
            if status != 204:
                raise RuntimeError(f"grant {role}: HTTP {status} {data}")
        return KeystoneUser(name, password, user_id, project, project_id)

    def user_token(self, user: KeystoneUser) -> str:
        return self.token(user.name, user.password, user.project_name)

    def system_token(self, user: str = "admin", password: str = "") -> str:
        """A system-scoped token (what Keystone asks for limits and
        system role grants)."""
        body = {
            "auth": {
                "identity": {
                    "methods": ["password"],
                    "password": {
                        "user": {
                            "name": user,
                            "domain": {"id": "default"},
                            "password": password or ADMIN_PASSWORD,
                        }
                    },
                },
                "scope": {"system": {"all": True}},
            }
        }
        status, _, headers = self.request("POST", "/auth/tokens", body)
        if status != 201:
            raise RuntimeError(f"system token for {user}: HTTP {status}")
        return headers["X-Subject-Token"]

    def grant_system_role(self, user_id: str, role: str) -> None:
        """Give ``user_id`` ``role`` on the system (e.g. reader, to read
        every project's limits as oslo.limit does)."""
        status, data, _ = self.request(
            "PUT", f"/system/users/{user_id}/roles/{self.role_id(role)}",
            token=self.system_token(),
        )  # fmt: skip
        if status != 204:
            raise RuntimeError(f"system grant {role}: HTTP {status} {data}")

    def endpoint_id(self, service_id: str) -> str:
        status, data, _ = self.request(
            "GET", f"/endpoints?service_id={service_id}", token=self.system_token()
        )
        if status != 200 or not data.get("endpoints"):
            raise RuntimeError(f"no endpoint of {service_id}: HTTP {status}")
        return str(data["endpoints"][0]["id"])

    def set_limit(
        self,
        service_id: str,
        resource: str,
        value: int,
        project_id: str | None = None,
        region: str = "RegionOne",
    ) -> None:
        """A unified limit: registered (the default of every project), or
        ``project_id``'s own."""
        kind, field = ("limits", "resource_limit")
        if project_id is None:
            kind, field = ("registered_limits", "default_limit")
        item: dict[str, Any] = {
            "service_id": service_id, "resource_name": resource,
            field: value, "region_id": region,
        }  # fmt: skip
        if project_id is not None:
            item["project_id"] = project_id
        status, data, _ = self.request(
            "POST", f"/{kind}", {kind: [item]}, self.system_token()
        )
        if status != 201:
            raise RuntimeError(f"create {kind} {resource}: HTTP {status} {data}")

    def delete_service(self, service_id: str) -> None:
        """Remove a catalog entry (and its endpoints)."""
        self.request("DELETE", f"/services/{service_id}", token=self.admin_token())

    def add_service(
        self, service_type: str, name: str, url: str, region: str = "RegionOne"
    ) -> str:
        """A catalog entry: a service and its public endpoint."""
        service_id = self._create("service", {"type": service_type, "name": name})
        self._create(
            "endpoint",
            {
                "service_id": service_id,
                "interface": "public",
                "url": url,
                "region_id": region,
            },
        )
        return service_id


def token_validator(keystone: Keystone) -> Any:
    """A function token -> (project id, role names) or None, asking
    ``keystone`` as a service would (``GET /v3/auth/tokens``)."""

    def validate(token: str) -> tuple[str, list[str]] | None:
        req = urllib.request.Request(keystone.url + "/auth/tokens", method="GET")
        req.add_header("X-Auth-Token", keystone.admin_token())
        req.add_header("X-Subject-Token", token)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                data = json.loads(resp.read())["token"]
        except urllib.error.HTTPError:
            return None
        project = data.get("project", {}).get("id")
        if not project:
            return None
        return str(project), [r["name"] for r in data.get("roles", [])]

    return validate
