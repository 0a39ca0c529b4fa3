"""A private puppetserver (Debian's 7.9.5 package) and Puppet agents.

The server runs as a plain ``java -jar puppetserver.jar`` process (the
command line of Debian's systemd unit, with ``-Xmx512m``), in a process
group of its own, with every directory (confdir, codedir, vardir, logs, the
CA) under one temporary directory and its own port. Nothing of the
machine-wide ``/etc/puppet`` is written; the Debian package's bootstrap
configuration (the list of Trapperkeeper services) is read from
``/etc/puppet/puppetserver/services.d``.
"""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import textwrap
import time

from trusted_testing.cluster import die_with_parent, free_port
from verifier.common.errors import TransportError
from verifier.common.http import BlockingClient

PUPPETSERVER_JAR = "/usr/share/puppetserver/puppetserver.jar"
BOOTSTRAP_CONFIG = "/etc/puppet/puppetserver/services.d"
JRUBY_LIB = "/usr/share/jruby/lib"
SERVER_CERTNAME = "localhost"
HOOK_CERTNAME = "revocation-hook"

_AUTH_CONF = """\
authorization: {
    version: 1
    rules: [
        {
            # Debian's "puppetlabs cert status" rule, with our revocation
            # hook's certname allowed next to the CA CLI's certificates.
            match-request: {
                path: "/puppet-ca/v1/certificate_status"
                type: path
                method: [get, put, delete]
            }
            allow: ["%(hook)s", {extensions: {pp_cli_auth: "true"}}]
            sort-order: 200
            name: "trusted-cloud revocation hook"
        },
%(debian_rules)s
    ]
}
"""


def _niced_child() -> None:
    """Before exec: die with the test process, and leave the CPU to the
    timing-sensitive tests running next to us (startup is CPU-bound for
    minutes)."""
    die_with_parent()
    os.nice(10)


def _debian_auth_rules() -> str:
    """The rules of Debian's auth.conf (between ``rules: [`` and ``]``)."""
    with open("/etc/puppet/puppetserver/conf.d/auth.conf", encoding="utf-8") as f:
        text = f.read()
    start = text.index("rules: [") + len("rules: [")
    end = text.rindex("]")
    return text[start:end].strip("\n")


class PuppetServer:
    """One puppetserver process with its own directories and port.

    Args:
        root: directory for everything (must exist and be empty).
        autosign: path of the ``autosign`` executable, or None.
    """

    def __init__(self, root: str, autosign: str | None) -> None:
        self.root = root
        self.port = free_port()
        self.autosign = autosign
        self.confdir = os.path.join(root, "etc")
        self.ssldir = os.path.join(self.confdir, "ssl")
        self.cadir = os.path.join(self.ssldir, "ca")
        self.codedir = os.path.join(root, "code")
        self.vardir = os.path.join(root, "var")
        self.logdir = os.path.join(root, "log")
        self.rundir = os.path.join(root, "run")
        self.tk_confdir = os.path.join(root, "conf.d")
        self.log = os.path.join(self.logdir, "puppetserver.log")
        self.out = os.path.join(self.logdir, "java.out")
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds = 0.0
        self._begin = 0.0

    @property
    def url(self) -> str:
        return f"https://{SERVER_CERTNAME}:{self.port}"

    @property
    def ca_cert(self) -> str:
        return os.path.join(self.cadir, "ca_crt.pem")

    @property
    def host_cert(self) -> str:
        return os.path.join(self.ssldir, "certs", f"{SERVER_CERTNAME}.pem")

    @property
    def host_key(self) -> str:
        return os.path.join(self.ssldir, "private_keys", f"{SERVER_CERTNAME}.pem")

    # -- configuration ------------------------------------------------------

    def _write(self, path: str, text: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)

    def configure(self) -> None:
        for d in (self.vardir, self.logdir, self.rundir, self.ssldir):
            os.makedirs(d, exist_ok=True)
        autosign = self.autosign or "false"
        self._write(
            os.path.join(self.confdir, "puppet.conf"),
            textwrap.dedent(f"""\
                [main]
                certname = {SERVER_CERTNAME}
                server = {SERVER_CERTNAME}
                serverport = {self.port}
                confdir = {self.confdir}
                codedir = {self.codedir}
                vardir = {self.vardir}
                logdir = {self.logdir}
                rundir = {self.rundir}
                ssldir = {self.ssldir}
                keylength = 2048
                [server]
                cadir = {self.cadir}
                autosign = {autosign}
                dns_alt_names = localhost,127.0.0.1
                ca_name = trusted-cloud test Puppet CA
                """),
        )
        self._write(
            os.path.join(
                self.codedir, "environments", "production", "manifests", "site.pp"
            ),
            "node default { notify { 'trusted-cloud catalog applied': } }\n",
        )
        self._write(
            os.path.join(
                self.codedir, "environments", "production", "environment.conf"
            ),
            "",
        )
        self._write_tk_config()

    def _write_tk_config(self) -> None:
        c = self.tk_confdir
        self._write(
            os.path.join(c, "global.conf"),
            f'global: {{ logging-config: "{self.root}/logback.xml" }}\n',
        )
        self._write(
            os.path.join(self.root, "logback.xml"),
            textwrap.dedent(f"""\
                <configuration>
                  <appender name="F1" class="ch.qos.logback.core.FileAppender">
                    <file>{self.log}</file>
                    <encoder><pattern>%d %-5p [%c{{2}}] %m%n</pattern></encoder>
                  </appender>
                  <root level="info"><appender-ref ref="F1"/></root>
                </configuration>
                """),
        )
        self._write(
            os.path.join(c, "puppetserver.conf"),
            textwrap.dedent(f"""\
                jruby-puppet: {{
                    ruby-load-path: [/usr/lib/puppetserver/ruby/vendor_ruby]
                    gem-home: "{self.vardir}/jruby-gems"
                    gem-path: ["{self.vardir}/jruby-gems",
                               "/usr/lib/puppetserver/vendored-jruby-gems"]
                    server-conf-dir: "{self.confdir}"
                    server-code-dir: "{self.codedir}"
                    server-var-dir: "{self.vardir}"
                    server-run-dir: "{self.rundir}"
                    server-log-dir: "{self.logdir}"
                    max-active-instances: 1
                }}
                """),
        )
        self._write(
            os.path.join(c, "webserver.conf"),
            textwrap.dedent(f"""\
                webserver: {{
                    client-auth: want
                    ssl-host: 127.0.0.1
                    ssl-port: {self.port}
                }}
                """),
        )
        with open(
            "/etc/puppet/puppetserver/conf.d/web-routes.conf", encoding="utf-8"
        ) as f:
            self._write(os.path.join(c, "web-routes.conf"), f.read())
        self._write(os.path.join(c, "ca.conf"), "certificate-authority: {}\n")
        self._write(
            os.path.join(c, "metrics.conf"),
            "metrics: { server-id: localhost, registries: { puppetserver: "
            "{ reporters: { jmx: { enabled: false } } } } }\n",
        )
        self._write(
            os.path.join(c, "auth.conf"),
            _AUTH_CONF % {"hook": HOOK_CERTNAME, "debian_rules": _debian_auth_rules()},
        )

    # -- process ------------------------------------------------------------

    def launch(self) -> None:
        """Write the configuration and start java (returns at once)."""
        self.configure()
        argv = [
            "java",
            "-Xms256m",
            "-Xmx512m",
            "-XX:+CrashOnOutOfMemoryError",
            # The client compiler only: less JIT work while starting, which
            # is most of this server's life in a test.
            "-XX:TieredStopAtLevel=1",
            f"-XX:ErrorFile={self.logdir}/java_err_pid%p.log",
            "-Djruby.logger.class=com.puppetlabs.jruby_utils.jruby.Slf4jLogger",
            f"-Djruby.lib={JRUBY_LIB}",
            "-jar",
            PUPPETSERVER_JAR,
            "--config",
            self.tk_confdir,
            "--bootstrap-config",
            BOOTSTRAP_CONFIG,
            "--restart-file",
            os.path.join(self.rundir, "restart"),
        ]
        self._begin = time.monotonic()
        with open(self.out, "ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.root,
                start_new_session=True,
                preexec_fn=_niced_child,  # noqa: PLW1509
            )

    def wait_running(self, timeout: float = 900.0) -> None:
        """Wait until the status endpoint says ``running`` (startup takes
        30 s to several minutes on a loaded two-core machine)."""
        assert self.proc is not None
        deadline = self._begin + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"puppetserver exited ({self.proc.returncode}); "
                    f"see {self.log} and {self.out}"
                )
            if self._status() == "running":
                self.startup_seconds = time.monotonic() - self._begin
                return
            time.sleep(2)
        raise RuntimeError(
            f"puppetserver not running after {timeout} s; see {self.log}"
        )

    def _status(self) -> str | None:
        if not os.path.exists(self.ca_cert):
            return None
        ctx = ssl.create_default_context(cafile=self.ca_cert)
        ctx.check_hostname = False
        try:
            answer = BlockingClient(ctx, 10).request(
                "GET",
                f"https://127.0.0.1:{self.port}/status/v1/simple",
                expect_json=False,
            )
        except TransportError:
            return None
        return answer.text() if answer.ok else None

    def stop(self) -> None:
        """Kill the server's process group (idempotent)."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass
