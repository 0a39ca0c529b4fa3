"""``trusted-verifier``: the cloud verifier service."""

from __future__ import annotations

import os

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg

from verifier import db, tlsutil
from verifier.api.verifier_app import make_app, public_pem
from verifier.attest import AgentClient, RegistrarClient, Verifier
from verifier.attest.ownership import make_ownership
from verifier.ca import CaError, CertificateAuthority
from verifier.cmd import _service
from verifier.exceptions import ConfigError
from verifier.notify import Outbox, load_notifiers


def load_signing_key(path: str) -> ed25519.Ed25519PrivateKey:
    """Load the Ed25519 event-signing key, creating it (0600) if missing.

    Raises:
        ConfigError: if the file exists but is not an Ed25519 key.
    """
    if not os.path.exists(path):
        key = ed25519.Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        return key
    try:
        with open(path, "rb") as f:
            loaded = serialization.load_pem_private_key(f.read(), None)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"[verifier] signing_key {path}: {exc}")
    if not isinstance(loaded, ed25519.Ed25519PrivateKey):
        raise ConfigError(f"[verifier] signing_key {path} is not an Ed25519 key")
    return loaded


def build(conf: cfg.ConfigOpts) -> tuple[Verifier, str]:
    """The verifier and its signing key's public PEM, from configuration."""
    group = conf.verifier
    _service.require(group, "cert_file", "key_file", "ca_file", "signing_key")
    signing_key = load_signing_key(group.signing_key)
    ca = None
    if group.ca_dir:
        try:
            ca = CertificateAuthority.load(group.ca_dir)
        except CaError as exc:
            raise ConfigError(str(exc))
    engine = db.make_engine(group.database_connection)
    db.upgrade(engine)
    notifiers = load_notifiers(conf, group.notifiers, signing_key.public_key())
    client_ctx = tlsutil.client_context(group.cert_file, group.key_file, group.ca_file)
    verifier = Verifier(
        engine,
        signing_key,
        RegistrarClient(group.registrar_url, client_ctx, group.agent_timeout),
        AgentClient(group.cert_file, group.key_file, group.agent_timeout),
        Outbox(engine, notifiers),
        ca,
        interval=group.quote_interval,
        max_unreachable=group.max_unreachable,
        max_in_flight=group.max_in_flight,
        ownership=make_ownership(group.coordination_url, group.member_id),
        sync_interval=group.sync_interval,
        unreachable_action=group.unreachable_action,
        outbox_interval=group.outbox_interval,
    )
    return verifier, public_pem(signing_key.public_key())


def main(argv: list[str] | None = None) -> int:
    conf = _service.setup(argv, "trusted-verifier")
    group = conf.verifier

    async def _main() -> None:
        verifier, pem = build(conf)
        ctx = tlsutil.server_context(group.cert_file, group.key_file, group.ca_file)
        await _service.serve(
            make_app(
                verifier,
                pem,
                {"tenant": group.tenant_clients, "operator": group.operator_clients},
            ),
            group.host,
            group.port,
            ctx,
            on_start=verifier.start,
            on_stop=verifier.stop,
        )

    return _service.run(_main)
