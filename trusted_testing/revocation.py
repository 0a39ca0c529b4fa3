"""The revocation pipeline for tests and benchmarks: a verifier-side
outbox with real notifier drivers and a ``trusted-revocation-listener``
process, wired with mTLS certificates from a throw-away CA."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

import requests
import sqlalchemy as sa
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg
from sqlalchemy.orm import Session

from trusted_testing.cluster import _script, free_port
from trusted_testing.procs import _write_conf, die_with_parent, wait_port
from verifier import conf as vconf
from verifier import db
from verifier.ca import CertificateAuthority
from verifier.notify import Outbox, load_notifiers
from verifier.notify.outbox import add_to_outbox, make_event
from verifier.protocol import SignedEvent

RABBIT_FAST_RECONNECT = {
    "amqp_durable_queues": "true",
    "rabbit_retry_interval": 1,
    "rabbit_retry_backoff": 1,
    "rabbit_interval_max": 2,
    "kombu_reconnect_delay": 0.5,
}


class Pipeline:
    """Keys, certificates and config for one verifier and one listener.

    Args:
        workdir: an empty directory owned by the caller.
        transport_url: the broker (None: webhook only).
        topic: a notification topic unique to the caller.
        db_url: the verifier database (default: a SQLite file in workdir).
    """

    def __init__(
        self,
        workdir: str,
        transport_url: str | None = None,
        topic: str = "t",
        db_url: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.pki = os.path.join(workdir, "pki")
        ca = CertificateAuthority.create(self.pki, "Revocation test CA")
        for name in ("verifier", "listener", "intruder"):
            ca.issue_to_files(self.pki, name, ["127.0.0.1", "localhost"])
        self.signing_key = ed25519.Ed25519PrivateKey.generate()
        self.signing_key_file = os.path.join(workdir, "verifier-signing.pem")
        with open(self.signing_key_file, "wb") as f:
            f.write(
                self.signing_key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
        self.public_key_file = os.path.join(workdir, "verifier-signing.pub")
        with open(self.public_key_file, "wb") as f:
            f.write(
                self.signing_key.public_key().public_bytes(
                    serialization.Encoding.PEM,
                    serialization.PublicFormat.SubjectPublicKeyInfo,
                )
            )
        self.transport_url = transport_url
        self.topic = topic
        self.webhook_port = free_port()
        self.record_file = os.path.join(workdir, "actions.jsonl")
        self.db_url = db_url or f"sqlite:///{workdir}/verifier.sqlite"
        self.engine = db.make_engine(self.db_url)
        db.upgrade(self.engine)
        self.listener: subprocess.Popen[bytes] | None = None

    def pki_file(self, name: str) -> str:
        return os.path.join(self.pki, name)

    def webhook_section(self) -> dict[str, Any]:
        """``[notifier_webhook]`` of a verifier posting to this listener."""
        return {
            "urls": f"https://127.0.0.1:{self.webhook_port}/v1/events",
            "cert_file": self.pki_file("verifier.pem"),
            "key_file": self.pki_file("verifier-key.pem"),
            "ca_file": self.pki_file("ca.pem"),
            "timeout": 30,
        }

    # -- verifier side ------------------------------------------------------
    def verifier_conf(
        self, notifiers: Sequence[str], durable: bool = True
    ) -> cfg.ConfigOpts:
        path = os.path.join(self.workdir, "verifier.conf")
        sections: dict[str, dict[str, Any]] = {
            "verifier": {
                "cert_file": self.pki_file("verifier.pem"),
                "key_file": self.pki_file("verifier-key.pem"),
                "ca_file": self.pki_file("ca.pem"),
            },
            "notifier_webhook": {
                "urls": f"https://127.0.0.1:{self.webhook_port}/v1/events",
                "timeout": 30,
            },
            "oslo_messaging_rabbit": dict(
                RABBIT_FAST_RECONNECT, amqp_durable_queues=str(durable).lower()
            ),
        }
        if self.transport_url:
            sections["notifier_messaging"] = {
                "transport_url": self.transport_url,
                "topic": self.topic,
            }
        _write_conf(path, sections)
        conf = cfg.ConfigOpts()
        vconf.register_opts(conf)
        conf(["--config-file", path])
        return conf

    def outbox(self, notifiers: Sequence[str], retry_delay: float = 0.0) -> Outbox:
        """A fresh outbox on the verifier database (as after a restart)."""
        conf = self.verifier_conf(notifiers)
        loaded = load_notifiers(conf, notifiers, self.signing_key.public_key())
        return Outbox(self.engine, loaded, retry_delay=retry_delay)

    def revoke(self, node_uuid: str, reason: str = "pcr_policy") -> SignedEvent:
        """Stage a signed revocation event as the verifier does."""
        now = time.time()
        signed = make_event(self.signing_key, node_uuid, reason, "test", now)
        with Session(self.engine) as session, session.begin():
            add_to_outbox(session, signed, now)
        return signed

    def undelivered(self) -> int:
        with Session(self.engine) as session:
            count = session.scalar(
                sa.select(sa.func.count())
                .select_from(db.OutboxEvent)
                .where(db.OutboxEvent.delivered_at.is_(None))
            )
        return int(count or 0)

    # -- listener side ------------------------------------------------------
    def start_listener(
        self,
        transports: Sequence[str],
        actions: Sequence[str] = ("log",),
        extra: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        path = os.path.join(self.workdir, "listener.conf")
        sections: dict[str, dict[str, Any]] = {
            "DEFAULT": {
                "log_file": os.path.join(self.workdir, "listener.log"),
                "debug": "false",
            },
            "revocation_hooks": {
                "actions": list(actions),
                "verifier_public_key": self.public_key_file,
                "state_dir": os.path.join(self.workdir, "listener-state"),
                "retry_delay": 0.1,
            },
            "action_log": {"record_file": self.record_file},
            "revocation_listener": {
                "transports": list(transports),
                "webhook_port": self.webhook_port,
                "cert_file": self.pki_file("listener.pem"),
                "key_file": self.pki_file("listener-key.pem"),
                "ca_file": self.pki_file("ca.pem"),
                "topic": self.topic,
                **({"transport_url": self.transport_url} if self.transport_url else {}),
            },
            "oslo_messaging_rabbit": RABBIT_FAST_RECONNECT,
            **(extra or {}),
        }
        _write_conf(path, sections)
        out = os.path.join(self.workdir, "listener.out")
        with open(out, "ab") as log:
            self.listener = subprocess.Popen(
                [_script("trusted-revocation-listener"), "--config-file", path],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        if "webhook" in transports:
            wait_port(self.webhook_port, self.listener, out)
        else:
            time.sleep(0.5)
            if self.listener.poll() is not None:
                with open(out, encoding="utf-8", errors="replace") as f:
                    raise RuntimeError(f"listener exited: {f.read()[-2000:]}")

    def stop_listener(self) -> None:
        proc, self.listener = self.listener, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def session(self, name: str = "verifier") -> requests.Session:
        """An HTTPS session presenting the ``name`` certificate."""
        s = requests.Session()
        s.trust_env = False  # REQUESTS_CA_BUNDLE would replace our CA
        s.cert = (self.pki_file(f"{name}.pem"), self.pki_file(f"{name}-key.pem"))
        s.verify = self.pki_file("ca.pem")
        return s

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.webhook_port}"

    def records(self) -> list[dict[str, Any]]:
        """What the ``log`` action recorded (one line per event)."""
        try:
            with open(self.record_file, encoding="utf-8") as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def close(self) -> None:
        self.stop_listener()
        self.engine.dispose()
