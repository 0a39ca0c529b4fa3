"""Install and run keylime 7.14.3 (registrar + verifier) for the comparison.

keylime lives in its own virtualenv, outside this repository, in
``~/.cache/trusted-cloud-bench/keylime-7.14.3``. The PyPI wheel declares no
dependencies, so the ones it really imports are installed next to it; its
``gpg`` import comes from Debian's ``python3-gpg``, which is built for
Debian's ``/usr/bin/python3``, so the venv is made from that interpreter with
``--system-site-packages``.

Configuration is written to a temporary directory and handed over through
``KEYLIME_{VERIFIER,REGISTRAR,TENANT,CA,LOGGING}_CONFIG``; ``KEYLIME_DIR``
points keylime's work dir (SQLite databases, generated CA) there too.
Everything keylime does not need for a PCR-only pull-mode attestation is
off: no revocation notifier, no durable attestation, no IMA or measured
boot policy. Everything else is keylime's shipped default (INFO logging,
one worker per core, SQLite, agent mTLS on).

Only loopback addresses are used.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

KEYLIME_VERSION = "7.14.3"
VENV = os.path.expanduser(f"~/.cache/trusted-cloud-bench/keylime-{KEYLIME_VERSION}")
PYTHON = os.path.join(VENV, "bin", "python")
# What keylime 7.14.3 imports at run time for registrar + verifier (the wheel
# declares none of it).
RUNTIME_DEPS = [
    "tornado",
    "sqlalchemy",
    "alembic",
    "cryptography",
    "pyyaml",
    "requests",
    "lark",
    "psutil",
    "jinja2",
    "pyasn1",
    "pyasn1-modules",
    "typing_extensions",
    "packaging",
    "jsonschema",
]


def _run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)


def ensure_venv() -> str:
    """Create the keylime venv if needed; return its python."""
    if os.path.exists(PYTHON):
        probe = subprocess.run(
            [PYTHON, "-c", "import keylime.cloud_verifier_tornado, gpg"],
            capture_output=True,
        )
        if probe.returncode == 0:
            return PYTHON
    if not os.path.exists("/usr/lib/python3/dist-packages/gpg"):
        _run(["apt-get", "install", "-y", "-q", "python3-gpg", "python3-venv"])
    os.makedirs(os.path.dirname(VENV), exist_ok=True)
    if not os.path.exists(PYTHON):
        _run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", VENV])
    _run([PYTHON, "-m", "pip", "install", "-q", f"keylime=={KEYLIME_VERSION}"])
    _run([PYTHON, "-m", "pip", "install", "-q", *RUNTIME_DEPS])
    return PYTHON


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_VERIFIER = """\
[verifier]
version = 2.6
uuid = default
ip = 127.0.0.1
port = {verifier_port}
registrar_ip = 127.0.0.1
registrar_port = {registrar_tls_port}
enable_agent_mtls = True
tls_dir = generate
server_key = default
server_key_password =
server_cert = default
cert_subject_alternative_names =
trusted_client_ca = default
client_key = default
client_key_password =
client_cert = default
trusted_server_ca = default
authorization_provider = simple
database_url = sqlite:///{workdir}/cv_data.sqlite
database_pool_sz_ovfl = 5,10
auto_migrate_db = True
num_workers = 0
exponential_backoff = True
retry_interval = 2
max_retries = 5
quote_interval = 0
max_upload_size = 104857600
request_timeout = 60.0
measured_boot_policy_name = accept-all
measured_boot_imports = []
measured_boot_evaluate = once
severity_labels = ["info", "notice", "warning", "error", "critical", "alert",
    "emergency"]
severity_policy = [{{"event_id": ".*", "severity_label": "emergency"}}]
ignore_tomtou_errors = False
durable_attestation_import =
persistent_store_url =
transparency_log_url =
time_stamp_authority_url =
time_stamp_authority_certs_path =
persistent_store_format = json
persistent_store_encoding =
transparency_log_sign_algo = sha256
signed_attributes =
require_allow_list_signatures = False
mode = pull
challenge_lifetime = 1800
verification_timeout = 0
session_create_rate_limit_per_ip = 50
session_create_rate_limit_window_ip = 60
session_create_rate_limit_per_agent = 15
session_create_rate_limit_window_agent = 60
session_lifetime = 180
extend_token_on_attestation = True
shutdown_drain_timeout = 10.0

[revocations]
enabled_revocation_notifications = []
zmq_ip = 127.0.0.1
zmq_port = {zmq_port}
webhook_url =
"""

_REGISTRAR = """\
[registrar]
version = 2.6
ip = 127.0.0.1
port = {registrar_port}
tls_port = {registrar_tls_port}
tls_dir = generate
server_key = default
server_key_password =
server_cert = default
cert_subject_alternative_names =
trusted_client_ca = default
authorization_provider = simple
database_url = sqlite:///{workdir}/reg_data.sqlite
database_pool_sz_ovfl = 5,10
auto_migrate_db = True
durable_attestation_import =
persistent_store_url =
transparency_log_url =
time_stamp_authority_url =
time_stamp_authority_certs_path =
persistent_store_format = json
persistent_store_encoding =
transparency_log_sign_algo = sha256
signed_attributes =
tpm_identity = default
malformed_cert_action = warn
"""

_TENANT = """\
[tenant]
version = 2.6
verifier_ip = 127.0.0.1
verifier_port = {verifier_port}
registrar_ip = 127.0.0.1
registrar_port = {registrar_tls_port}
tls_dir = default
enable_agent_mtls = True
client_key = default
client_key_password =
client_cert = default
trusted_server_ca = default
tpm_cert_store = /var/lib/keylime/tpm_cert_store
max_payload_size = 1048576
accept_tpm_hash_algs = ["sha512", "sha384", "sha256"]
accept_tpm_encryption_algs = ["ecc", "rsa"]
accept_tpm_signing_algs = ["ecschnorr", "rsassa", "ecdsa"]
exponential_backoff = True
retry_interval = 2
max_retries = 5
request_timeout = 60
require_ek_cert = False
ek_check_script =
mb_refstate =
"""

_CA = """\
[ca]
version = 2.6
password = default
cert_country = US
cert_ca_name = Keylime Certificate Authority
cert_state = MA
cert_locality = Lexington
cert_organization = MITLL
cert_org_unit = 53
cert_ca_lifetime = 3650
cert_lifetime = 365
cert_bits = 2048
cert_crl_dist = http://localhost:38080/crl
"""

# keylime's shipped logging defaults: INFO to the console (here: a log file).
_LOGGING = """\
[logging]
version = 2.6

[loggers]
keys = root,keylime

[handlers]
keys = consoleHandler

[formatters]
keys = formatter

[formatter_formatter]
format = %(asctime)s.%(msecs)03d - %(name)s - %(levelname)s - %(message)s
datefmt = %Y-%m-%d %H:%M:%S

[logger_root]
level = INFO
handlers = consoleHandler

[handler_consoleHandler]
class = StreamHandler
level = INFO
formatter = formatter
args = (sys.stdout,)

[logger_keylime]
level = INFO
qualname = keylime
handlers =
"""


class KeylimeServices:
    """keylime's registrar and verifier as subprocesses, in ``workdir``."""

    def __init__(self, workdir: str) -> None:
        self.workdir = os.path.abspath(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.verifier_port = free_port()
        self.registrar_port = free_port()
        self.registrar_tls_port = free_port()
        values = {
            "workdir": self.workdir,
            "verifier_port": self.verifier_port,
            "registrar_port": self.registrar_port,
            "registrar_tls_port": self.registrar_tls_port,
            "zmq_port": free_port(),
        }
        self.env = dict(os.environ)
        for name, text in (
            ("verifier", _VERIFIER),
            ("registrar", _REGISTRAR),
            ("tenant", _TENANT),
            ("ca", _CA),
            ("logging", _LOGGING),
        ):
            path = os.path.join(self.workdir, f"{name}.conf")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text.format(**values) if name != "logging" else text)
            os.chmod(path, 0o600)
            self.env[f"KEYLIME_{name.upper()}_CONFIG"] = path
        self.env["KEYLIME_DIR"] = self.workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def cv_ca(self) -> str:
        """Directory of the CA keylime generated (tls_dir = generate)."""
        return os.path.join(self.workdir, "cv_ca")

    @property
    def verifier_url(self) -> str:
        return f"https://127.0.0.1:{self.verifier_port}"

    @property
    def registrar_url(self) -> str:
        """Plain-HTTP registration endpoint, as agents use it."""
        return f"http://127.0.0.1:{self.registrar_port}"

    def _start(self, name: str, module: str, port: int) -> None:
        log = open(os.path.join(self.workdir, f"{name}.log"), "wb")  # noqa: SIM115
        self.procs[name] = subprocess.Popen(
            [PYTHON, "-m", module],
            cwd=self.workdir,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            # keylime forks workers and a shared-memory manager that outlive
            # a terminated parent: give them a process group to stop as one.
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while True:
            if self.procs[name].poll() is not None:
                raise RuntimeError(
                    f"keylime {name} exited; see {self.workdir}/{name}.log"
                )
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"keylime {name} did not listen on {port}"
                    ) from None
                time.sleep(0.3)

    def start(self) -> None:
        # The verifier generates the CA (cv_ca); the registrar reuses it.
        self._start("verifier", "keylime.cmd.verifier", self.verifier_port)
        self._start("registrar", "keylime.cmd.registrar", self.registrar_port)

    def stop(self) -> None:
        procs = list(reversed(list(self.procs.values())))
        for proc in procs:
            _killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
            # Workers left behind by the parent, if any.
            _killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def cleanup(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)
