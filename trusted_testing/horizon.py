"""A real Horizon (PyPI ``horizon``, ``openstack_dashboard``) for tests.

``Horizon(work_dir, keystone_url, ...).start()`` writes a
``local_settings`` (the test Keystone, a generated ``SECRET_KEY``, signed
sessions in files, ``DEBUG = False`` so errors look as a user sees them) and
a ``local/enabled`` directory with the plugins' enabled files, then serves
``openstack_dashboard.wsgi.application`` with werkzeug on a loopback port
in a child process, its static files beside it.

Nothing is written into the installed ``openstack_dashboard``: the child
puts ``work_dir/local`` first on ``openstack_dashboard.local``'s package
path (where Horizon imports ``local.enabled`` from) and on ``sys.path``
(where it imports ``local.local_settings`` from).

Horizon's pages need their static files collected and compressed
(``collectstatic`` and ``compress``, SCSS compiled: ~5 s on these
machines). That is done once into ``~/.cache/trusted-cloud/horizon-static``
(``TRUSTED_HORIZON_CACHE`` overrides it), one directory per key: the
versions of Horizon and the packages behind its static files, and the
contents of the plugins' templates and static files. A later start with the
same key reuses it; builds of other keys unused for a week are removed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from trusted_testing.procs import die_with_parent, wait_port

__all__ = ["Horizon", "HorizonError", "static_cache_root"]

#: the child: ``manage ARGS`` runs a Django management command with the
#: test's settings, otherwise it serves Horizon (and its static files)
_SERVE = """
import os
import sys
work = os.environ["TRUSTED_HORIZON_DIR"]
sys.path.insert(0, work)  # local.local_settings
import openstack_dashboard.local
openstack_dashboard.local.__path__.insert(0, os.path.join(work, "local"))
os.environ["DJANGO_SETTINGS_MODULE"] = "openstack_dashboard.settings"
if sys.argv[1:2] == ["manage"]:
    from django.core.management import execute_from_command_line
    execute_from_command_line(["manage.py", *sys.argv[2:]])
    sys.exit(0)
from werkzeug.middleware.shared_data import SharedDataMiddleware
from werkzeug.serving import WSGIRequestHandler, run_simple
from openstack_dashboard.wsgi import application
sys.stdout = sys.__stdout__
static = os.environ["TRUSTED_HORIZON_STATIC"]
app = SharedDataMiddleware(application, {"/static": static}, cache_timeout=3600)
WSGIRequestHandler.protocol_version = "HTTP/1.1"  # keep-alive for the browser
run_simple("127.0.0.1", int(os.environ["TRUSTED_HORIZON_PORT"]), app, threaded=True)
"""

_LOCAL_SETTINGS = """
# Written by trusted_testing.horizon for one test run.
import os
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
SECRET_KEY = {secret_key!r}
OPENSTACK_KEYSTONE_URL = {keystone_url!r}
OPENSTACK_KEYSTONE_DEFAULT_DOMAIN = "Default"
OPENSTACK_SSL_CACERT = {ssl_cacert!r}
SESSION_ENGINE = "django.contrib.sessions.backends.file"
SESSION_FILE_PATH = {sessions!r}
CACHES = {{"default": {{"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}}}
STATIC_ROOT = os.environ["TRUSTED_HORIZON_STATIC"]
STATIC_URL = "/static/"
COMPRESS_OFFLINE = True
AVAILABLE_THEMES = [("default", "Default", "themes/default")]
DEFAULT_THEME = "default"
POLICY_FILES = {{
    "identity": "keystone_policy.yaml",
    "compute": "nova_policy.yaml",
    "volume": "cinder_policy.yaml",
    "image": "glance_policy.yaml",
    "network": "neutron_policy.yaml",
    **{policy_files!r},
}}
LOGGING = {{
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {{"stderr": {{"class": "logging.StreamHandler"}}}},
    "root": {{"handlers": ["stderr"], "level": "WARNING"}},
    "loggers": {{"django.request": {{"level": "ERROR"}}}},
}}
{extra}
"""

#: distributions whose files end up in Horizon's collected static files
_STATIC_DISTS = ("horizon", "Django", "django-compressor", "django-pyscss")


class HorizonError(RuntimeError):
    """Horizon could not be set up or did not start."""


def static_cache_root() -> str:
    """Where collected and compressed static files are kept between runs."""
    root = os.environ.get("TRUSTED_HORIZON_CACHE")
    if root:
        return root
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(cache, "trusted-cloud", "horizon-static")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise HorizonError(f"no package {name} installed")
    return str(list(spec.submodule_search_locations)[0])


def _static_key(enabled_files: Sequence[str], packages: Sequence[str]) -> str:
    """What the collected and compressed files depend on."""
    digest = hashlib.sha256()
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name in _STATIC_DISTS or name.lower().startswith("xstatic"):
            digest.update(f"{name}=={dist.version}\n".encode())
    files = list(enabled_files)
    for package in packages:
        for root, dirs, names in os.walk(_package_dir(package)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            files += [
                os.path.join(root, n)
                for n in sorted(names)
                if n.endswith((".html", ".js", ".css", ".scss", ".svg"))
            ]
    for path in sorted(files):
        digest.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()[:24]


def _prune(root: str, days: float = 7.0) -> None:
    """Remove the builds of other keys (other Horizon versions, older
    templates) that no start used for ``days``, and builds left half done."""
    cutoff = time.time() - days * 86400
    names = os.listdir(root) if os.path.isdir(root) else []
    for name in names:
        path = os.path.join(root, name)
        try:
            if os.path.getmtime(path) < cutoff:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:  # removed by another process meanwhile
            continue


class Horizon:
    """One Horizon process on loopback, its files under ``work_dir``.

    Args:
        work_dir: settings, enabled files and the log go here.
        keystone_url: ``OPENSTACK_KEYSTONE_URL`` (``.../v3``).
        enabled_files: plugins' ``enabled/_NNNN_*.py`` files, copied into
            the ``local/enabled`` directory Horizon reads.
        packages: the plugins' packages (their templates and static files
            are part of the static cache's key).
        policy_files: more ``POLICY_FILES`` entries (service type -> path).
        ssl_cacert: ``OPENSTACK_SSL_CACERT`` (the services' CA).
        settings: more settings (name -> value, written with ``repr``).
    """

    def __init__(
        self,
        work_dir: str,
        keystone_url: str,
        enabled_files: Sequence[str] = (),
        packages: Sequence[str] = (),
        policy_files: Mapping[str, str] | None = None,
        ssl_cacert: str | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        self.work_dir = os.path.abspath(work_dir)
        self.keystone_url = keystone_url
        self.enabled_files = list(enabled_files)
        self.packages = list(packages)
        self.policy_files = dict(policy_files or {})
        self.ssl_cacert = ssl_cacert
        self.settings = dict(settings or {})
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.static_dir = ""
        #: whether :meth:`start` found its static files in the cache
        self.static_cached = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        return os.path.join(self.work_dir, "horizon.log")

    # -- set-up --------------------------------------------------------------

    def _write_local(self) -> None:
        local = os.path.join(self.work_dir, "local")
        enabled = os.path.join(local, "enabled")
        shutil.rmtree(local, ignore_errors=True)
        os.makedirs(enabled)
        for path in (
            os.path.join(local, "__init__.py"),
            os.path.join(enabled, "__init__.py"),
        ):
            with open(path, "w") as f:
                f.write("")
        for path in self.enabled_files:
            shutil.copy(path, enabled)
        sessions = os.path.join(self.work_dir, "sessions")
        os.makedirs(sessions, exist_ok=True)
        extra = "".join(f"{k} = {v!r}\n" for k, v in self.settings.items())
        with open(os.path.join(local, "local_settings.py"), "w") as f:
            f.write(
                _LOCAL_SETTINGS.format(
                    secret_key=secrets.token_urlsafe(32),
                    keystone_url=self.keystone_url,
                    sessions=sessions,
                    ssl_cacert=self.ssl_cacert,
                    policy_files=self.policy_files,
                    extra=extra,
                )
            )
        with open(os.path.join(self.work_dir, "serve.py"), "w") as f:
            f.write(_SERVE)

    def _env(self, static_dir: str) -> dict[str, str]:
        return dict(
            os.environ,
            TRUSTED_HORIZON_DIR=self.work_dir,
            TRUSTED_HORIZON_STATIC=static_dir,
            TRUSTED_HORIZON_PORT=str(self.port),
            OS_NOVA_DISABLE_EVENTLET_PATCHING="1",
        )

    def _manage(self, static_dir: str, *args: str) -> None:
        argv = [sys.executable, os.path.join(self.work_dir, "serve.py"), "manage"]
        result = subprocess.run(
            [*argv, *args],
            env=self._env(static_dir),
            capture_output=True,
            timeout=900,
            check=False,
        )
        if result.returncode != 0:
            raise HorizonError(
                f"manage.py {args[0]} failed: {result.stderr.decode()[-3000:]}"
            )

    def _static(self) -> str:
        """The collected and compressed static files (built once per key)."""
        root = static_cache_root()
        final = os.path.join(root, _static_key(self.enabled_files, self.packages))
        if os.path.exists(os.path.join(final, ".complete")):
            self.static_cached = True
            os.utime(final)  # in use: not pruned
            return final
        os.makedirs(root, exist_ok=True)  # a fresh machine has no cache yet
        _prune(root)
        building = f"{final}.{os.getpid()}.tmp"
        shutil.rmtree(building, ignore_errors=True)
        try:
            self._manage(building, "collectstatic", "--noinput", "-v0")
            self._manage(building, "compress", "--force", "-v0")
            with open(os.path.join(building, ".complete"), "w") as f:
                f.write("")
            try:
                os.rename(building, final)
            except OSError:  # another process built it at the same time
                if not os.path.exists(os.path.join(final, ".complete")):
                    raise
        finally:
            shutil.rmtree(building, ignore_errors=True)
        return final

    def start(self) -> None:
        """Write the settings, build or reuse the static files, serve."""
        os.makedirs(self.work_dir, exist_ok=True)
        self._write_local()
        self.static_dir = self._static()
        argv = [sys.executable, os.path.join(self.work_dir, "serve.py")]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                argv,
                env=self._env(self.static_dir),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,  # noqa: PLW1509
            )
        wait_port(self.port, self.proc, self.log, timeout=120.0)
        self._wait_login_page()

    def _wait_login_page(self, timeout: float = 120.0) -> None:
        """Django loads lazily: the first page is slow, ask it here."""
        deadline = time.monotonic() + timeout
        status: object = None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/auth/login/", timeout=60) as r:
                    if r.status == 200:
                        return
                    status = r.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            except OSError as exc:
                status = exc
            if self.proc is not None and self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise HorizonError(f"Horizon's login page: {status}; see {self.log}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
