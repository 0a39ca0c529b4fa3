"""A private Prometheus and Alertmanager for tests (Debian's ``prometheus``
and ``prometheus-alertmanager``), and the webhook that receives what
Alertmanager sends (doc/source/admin/monitoring.rst).

Each runs as the current user on free loopback ports with a configuration
generated in its own directory; the Debian packages' own daemons (ports
9090 and 9093) are never used. Intervals are 1 s so that a test waits
seconds, not minutes, for an alert. Configurations are written as JSON,
which is YAML.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from trusted_testing.cluster import free_port
from trusted_testing.procs import kill_group, spawn, wait_until

__all__ = [
    "ALERTMANAGER",
    "PROMETHEUS",
    "PrivateAlertmanager",
    "PrivatePrometheus",
    "ScrapeTarget",
    "WebhookReceiver",
]

PROMETHEUS = "/usr/bin/prometheus"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
RULES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "etc",
    "prometheus",
    "trusted-cloud.rules.yml",
)


def _require(path: str, package: str) -> None:
    if not os.path.exists(path):
        raise RuntimeError(
            f"{path} missing: apt-get install --no-install-recommends {package} "
            "(tools/apt-packages.txt)"
        )


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
        return json.load(resp)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310
            return bool(resp.status == 200)
    except OSError:
        return False


class _Daemon:
    """A child process on a free port, stopped by :meth:`stop`."""

    def __init__(self, workdir: str, name: str) -> None:
        self.dir = os.path.join(workdir, name)
        os.makedirs(self.dir, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = os.path.join(self.dir, f"{name}.log")
        self._proc: subprocess.Popen[bytes] | None = None

    def _start(self, argv: list[str], what: str) -> None:
        self._proc = spawn(argv, self.log)
        proc = self._proc
        wait_until(
            lambda: proc.poll() is not None or _ready(self.url + "/-/ready"),
            60,
            what=f"{what} ready ({self.log})",
        )
        if proc.poll() is not None:
            with open(self.log, errors="replace") as f:
                raise RuntimeError(f"{what} exited:\n{f.read()[-2000:]}")

    def stop(self) -> None:
        kill_group(self._proc, self.port)
        self._proc = None

    def _write(self, name: str, config: Mapping[str, Any]) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=1)
        return path


class WebhookReceiver:
    """An HTTP server on 127.0.0.1 that keeps every JSON body posted to it
    (Alertmanager's webhook notifications)."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        received = self.posts

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                size = int(self.headers.get("Content-Length", "0"))
                received.append(json.loads(self.rfile.read(size)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/alerts"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert of every notification received so far."""
        return [alert for post in list(self.posts) for alert in post.get("alerts", ())]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class PrivateAlertmanager(_Daemon):
    """Alertmanager routing every alert to ``webhook_url`` (group_wait 1 s).

    Args:
        workdir: where its configuration, data and log go.
        webhook_url: the receiver's URL.
    """

    def __init__(self, workdir: str, webhook_url: str) -> None:
        _require(ALERTMANAGER, "prometheus-alertmanager")
        super().__init__(workdir, "alertmanager")
        route = {
            "receiver": "webhook",
            "group_by": ["alertname"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        }
        receiver = {"name": "webhook", "webhook_configs": [{"url": webhook_url}]}
        self.config = self._write(
            "alertmanager.yml", {"route": route, "receivers": [receiver]}
        )

    def start(self) -> None:
        self._start(
            [
                ALERTMANAGER,
                f"--config.file={self.config}",
                f"--storage.path={os.path.join(self.dir, 'data')}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
            ],
            "alertmanager",
        )


class ScrapeTarget:
    """A service Prometheus scrapes over mTLS.

    Args:
        job: the job name (``trusted-cloud-verifier``...).
        address: ``host:port``.
        ca_file, cert_file, key_file: the CA of the service's certificate
            and the client certificate (and key) its rule accepts.
    """

    def __init__(
        self, job: str, address: str, ca_file: str, cert_file: str, key_file: str
    ) -> None:
        self.job = job
        self.address = address
        self.tls = {"ca_file": ca_file, "cert_file": cert_file, "key_file": key_file}

    def to_config(self) -> dict[str, Any]:
        return {
            "job_name": self.job,
            "scheme": "https",
            "metrics_path": "/metrics",
            "tls_config": self.tls,
            "static_configs": [{"targets": [self.address]}],
        }


class PrivatePrometheus(_Daemon):
    """Prometheus scraping ``targets`` and evaluating ``rule_files`` every
    second, alerting ``alertmanager_port``.

    Args:
        workdir: where its configuration, data and log go.
        targets: the services to scrape.
        alertmanager_port: the Alertmanager's port on 127.0.0.1.
        rule_files: alerting rules (default: the repository's).
    """

    def __init__(
        self,
        workdir: str,
        targets: Sequence[ScrapeTarget],
        alertmanager_port: int,
        rule_files: Sequence[str] = (RULES,),
    ) -> None:
        _require(PROMETHEUS, "prometheus")
        super().__init__(workdir, "prometheus")
        rules = []
        for path in rule_files:  # next to the configuration: self-contained
            rules.append(shutil.copy(path, self.dir))
        alerting = {
            "alertmanagers": [
                {"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}
            ]
        }
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": rules,
            "alerting": alerting,
            "scrape_configs": [t.to_config() for t in targets],
        }
        self.config = self._write("prometheus.yml", config)

    def start(self) -> None:
        self._start(
            [
                PROMETHEUS,
                f"--config.file={self.config}",
                f"--storage.tsdb.path={os.path.join(self.dir, 'data')}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            "prometheus",
        )

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of PromQL ``expr`` (its ``result``)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        return list(_get_json(url)["data"]["result"])

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets with their health and last error."""
        return list(_get_json(f"{self.url}/api/v1/targets")["data"]["activeTargets"])

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts its rules hold now (pending or firing)."""
        return list(_get_json(f"{self.url}/api/v1/alerts")["data"]["alerts"])
