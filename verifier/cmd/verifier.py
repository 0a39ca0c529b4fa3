"""``trusted-verifier``: the cloud verifier service.

Optional parts need their extras: ``[abe] enabled`` the ``abe`` extra,
``[monitor] enabled`` the ``tpm`` extra, ``[verifier] coordination_url``
the ``scale`` extra; a missing one is a configuration error naming it.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from oslo_config import cfg
from oslo_log import log as logging

from verifier import db
from verifier.api.authz import Auth
from verifier.api.monitor_app import add_monitor_routes
from verifier.api.verifier_app import make_app, public_pem
from verifier.attest import (
    RegistrarClient,
    Verifier,
    VerifierAgentClient,
    VerifierSettings,
    memtrim,
)
from verifier.attest.grants import CapabilityIssuer
from verifier.attest.instances import NovaInstanceOwners
from verifier.attest.monitor import HostTpm, MonitorBatcher
from verifier.attest.ownership import make_ownership
from verifier.attest.policies import PolicyStore
from verifier.attest.quotas import Quotas
from verifier.attest.trait_runner import TraitRunner
from verifier.ca import CaError, CertificateAuthority
from verifier.cmd import _service
from verifier.common import extras, version
from verifier.common import tls as tlsutil
from verifier.common.http import AsyncClient
from verifier.exceptions import ConfigError
from verifier.keyservice.keys import load_mac_key
from verifier.notify import Outbox, load_notifiers
from verifier.policies import make_enforcer
from verifier.policies.base import OBSERVER_ROLE
from verifier.protocol.errors import MalformedError
from verifier.protocol.ima.signing import VerifyingKey
from verifier.protocol.mb.efisig import key_from_text
from verifier.protocol.push import PushRules

if TYPE_CHECKING:
    from verifier.attest.abe_keys import AbeAuthority


def _require(extra: str, feature: str) -> None:
    try:
        extras.require(extra, feature)
    except extras.MissingExtraError as exc:
        raise ConfigError(str(exc))


LOG = logging.getLogger(__name__)


def build_abe(conf: cfg.ConfigOpts, agents: VerifierAgentClient) -> AbeAuthority | None:
    """The CP-ABE authority, if ``[abe] enabled``.

    Raises:
        ConfigError: the ``abe`` extra is not installed.
    """
    if not conf.abe.enabled:
        return None
    _require("abe", "[abe] enabled")
    from verifier.attest.abe_keys import AbeAuthority, ProviderAttributes

    return AbeAuthority(
        conf.abe.master_key_file,
        ProviderAttributes(conf.abe.provider_attributes_file),
        agents,
    )


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


def _load_public_key(path: str) -> VerifyingKey:
    try:
        with open(path, "rb") as f:
            key = serialization.load_pem_public_key(f.read())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"[verifier] policy_signing_keys {path}: {exc}")
    if not isinstance(key, ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey):
        raise ConfigError(f"[verifier] policy_signing_keys {path}: not Ed25519/ECDSA")
    return key


def load_min_dbx(path: str | None) -> frozenset[str]:
    """The ``mb_min_dbx_file`` entries (empty when unset).

    Raises:
        ConfigError: the file cannot be read or has a bad entry (naming
            the line).
    """
    if not path:
        return frozenset()
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"[verifier] mb_min_dbx_file {path}: {exc}") from None
    keys = set()
    for number, line in enumerate(lines, start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            keys.add(key_from_text(text, f"line {number}"))
        except MalformedError as exc:
            raise ConfigError(
                f"[verifier] mb_min_dbx_file {path}: {exc.detail}"
            ) from None
    return frozenset(keys)


def _quotas(conf: cfg.ConfigOpts) -> Quotas:
    """The ``[quota]`` limits (from Keystone's unified limits, or the
    configuration)."""
    q = conf.quota
    source = None
    if q.source == "keystone":
        from verifier.attest.keystone_limits import KeystoneLimits

        source = KeystoneLimits(conf.config_file)
    return Quotas(q.nodes, q.pending_enrolments, q.policies, q.policy_bytes, source)


def _load_ca(path: str) -> CertificateAuthority | None:
    """The node-identity CA in ``path`` (None: no CA configured)."""
    if not path:
        return None
    try:
        return CertificateAuthority.load(path)
    except CaError as exc:
        raise ConfigError(str(exc))


def build(conf: cfg.ConfigOpts) -> tuple[Verifier, str]:
    """The verifier and its signing key's public PEM, from configuration."""
    group = conf.verifier
    _service.require_options(group, "cert_file", "key_file", "ca_file", "signing_key")
    signing_key = load_signing_key(group.signing_key)
    engine = db.make_engine(group.database_connection)
    db.upgrade(engine)
    notifiers = load_notifiers(conf, group.notifiers, signing_key.public_key())
    client_ctx = tlsutil.client_context(group.cert_file, group.key_file, group.ca_file)
    agents = VerifierAgentClient(
        group.cert_file,
        group.key_file,
        group.agent_timeout,
        keep_alive=group.agent_keep_alive,
    )
    quotas = _quotas(conf)
    outbox = Outbox(
        engine,
        notifiers,
        retry_delay=group.outbox_retry_delay,
        max_retry_delay=group.outbox_max_retry_delay,
    )
    keys = [_load_public_key(p) for p in group.policy_signing_keys]
    verifier = Verifier(
        engine,
        signing_key,
        RegistrarClient(group.registrar_url, client_ctx, group.agent_timeout),
        agents,
        outbox,
        _load_ca(group.ca_dir),
        VerifierSettings.from_conf(conf),
        ownership=make_ownership(
            group.coordination_url, group.member_id, group.coordination_group
        ),
        policies=PolicyStore(
            engine,
            keys,
            group.policy_max_entries,
            quotas=quotas,
            min_dbx=load_min_dbx(group.mb_min_dbx_file),
        ),
        abe=build_abe(conf, agents),
        quotas=quotas,
        traits=build_traits(conf),
    )
    return verifier, public_pem(signing_key.public_key())


def build_traits(conf: cfg.ConfigOpts) -> TraitRunner | None:
    """The Placement trait sync of the compute hosts, if ``[placement]
    trait_sync`` (None: off, e.g. no Placement endpoint configured).

    Raises:
        ConfigError: ``[placement]`` options that do not load.
    """
    group = conf.placement
    if not group.trait_sync:
        return None
    from verifier.placement import PlacementClient, TraitSync

    client = PlacementClient.from_conf(conf)
    sync = TraitSync(client, group.trait, retry_interval=group.retry_interval)
    LOG.info("Placement: trait %s kept on attested hosts", group.trait)
    return TraitRunner(sync)


def build_push_rules(conf: cfg.ConfigOpts) -> PushRules:
    """The ``[push]`` limits."""
    return VerifierSettings.from_conf(conf).push_rules


async def start_push_site(
    conf: cfg.ConfigOpts, verifier: Verifier
) -> asyncio.AbstractServer | None:
    """Serve the push endpoint on ``[push] port`` (None: disabled), over TLS
    with the verifier's certificate and no client certificate required."""
    if not conf.push.port:
        return None
    from verifier.api.push_app import make_push_app
    from verifier.common import lean_server

    ctx = _service.server_tls(conf.verifier, client_cert_optional=True)
    try:
        server = await lean_server.serve(
            make_push_app(verifier.push, conf.push.keepalive),
            conf.verifier.host,
            conf.push.port,
            tls=ctx,
            keepalive=conf.push.keepalive,
            request_timeout=conf.push.request_timeout,
        )
    except OSError as exc:  # e.g. another verifier on this host has it
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        raise OSError(exc.errno, f"[push] port {conf.push.port}: {why}")
    LOG.info("Push endpoint on https://%s:%d", conf.verifier.host, conf.push.port)
    return server


def build_monitor(
    conf: cfg.ConfigOpts,
) -> tuple[MonitorBatcher, HostTpm] | None:
    """Monitor attestation from the host TPM, if ``[monitor] enabled``.

    Raises:
        ConfigError: the ``tpm`` extra is not installed.
    """
    group = conf.monitor
    if not group.enabled:
        return None
    _require("tpm", "[monitor] enabled")
    host = HostTpm(group.tcti, list(group.pcrs), group.ek_alg, group.ak_alg)
    batcher = MonitorBatcher(host.quote, group.window_ms / 1000.0, group.max_batch)
    return batcher, host


def build_auth(conf: cfg.ConfigOpts) -> Auth:
    """Who may call the API: Keystone tokens (``auth_strategy =
    keystone``) or tenant certificates (``noauth``), machine identities by
    certificate, and the policy (:mod:`verifier.policies`)."""
    group = conf.verifier
    tenants: list[str] = []
    keystone = None
    if group.auth_strategy == "keystone":
        from verifier.api.keystone import KeystoneAuthenticator

        keystone = KeystoneAuthenticator(conf)
    else:
        tenants = list(group.tenant_clients)
        LOG.warning(
            "auth_strategy = noauth: no Keystone, tenants are the client "
            "certificates %s and there is no Nova instance-ownership check "
            "(the embedded demo and tests only)",
            ", ".join(tenants) or "(none)",
        )
    machines = {
        "service": group.operator_clients,
        OBSERVER_ROLE: group.observer_clients,
        "capability": conf.capabilities.clients,
        "monitor": conf.monitor.clients,
    }
    return Auth(
        make_enforcer(conf),
        keystone,
        Auth.certificate_roles(tenants, machines),
    )


def build_instances(conf: cfg.ConfigOpts, auth: Auth) -> NovaInstanceOwners | None:
    """The instance-owner check, with Keystone and ``instance_owner_check
    = nova`` (Nova's endpoint trusted with the system's CAs and ca_file)."""
    group = conf.verifier
    if auth.keystone is None or group.instance_owner_check != "nova":
        return None
    context = tlsutil.client_context(None, None, None)
    if group.ca_file:
        context.load_verify_locations(group.ca_file)
    return NovaInstanceOwners(
        AsyncClient(context, group.agent_timeout), group.compute_interface
    )


def _extra_routes(
    verifier: Verifier, monitor: tuple[MonitorBatcher, HostTpm] | None
) -> list[Callable[[web.Application], None]]:
    """The route sets of the enabled optional parts (CP-ABE keys, monitor
    attestation)."""
    routes: list[Callable[[web.Application], None]] = []
    if verifier.abe is not None:
        from verifier.api.abe_app import add_abe_routes

        routes.append(functools.partial(add_abe_routes, authority=verifier.abe))
    if monitor is not None:
        batcher, host = monitor
        routes.append(functools.partial(add_monitor_routes, batcher=batcher, host=host))
    return routes


def _issuer(conf: cfg.ConfigOpts, verifier: Verifier) -> CapabilityIssuer | None:
    """The capability issuer, if ``[capabilities] key_file`` is set."""
    caps = conf.capabilities
    if not caps.key_file:
        return None
    key = load_mac_key(caps.key_file)
    return CapabilityIssuer(verifier.queries, verifier.outbox, key, caps.ttl)


class _Process:
    """Starts and stops what runs beside the API: the verifier's loops,
    the push endpoint and the monitor's batcher."""

    def __init__(
        self,
        conf: cfg.ConfigOpts,
        verifier: Verifier,
        monitor: tuple[MonitorBatcher, HostTpm] | None,
    ) -> None:
        self._conf = conf
        self._verifier = verifier
        self._monitor = monitor
        self._push: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        if self._monitor is not None:
            self._monitor[0].start()
        await self._verifier.start()
        self._push = await start_push_site(self._conf, self._verifier)

    async def stop(self) -> None:
        if self._push is not None:
            self._push.close()
            await self._push.wait_closed()
        await self._verifier.stop()
        if self._monitor is not None:
            await self._monitor[0].stop()
            self._monitor[1].close()


def main(argv: list[str] | None = None) -> int:
    version.exit_if_asked(argv, "trusted-verifier")
    memtrim.limit_arenas()  # before any thread: see verifier.attest.memtrim
    conf = _service.setup(argv, "trusted-verifier")
    group = conf.verifier

    async def _main() -> None:
        verifier, pem = build(conf)
        monitor = build_monitor(conf)
        # no certificate needed to connect (tenants with tokens, load
        # balancers' /healthcheck); every route with a rule still needs
        # an identity (401, verifier.api.authz)
        ctx = _service.server_tls(group, client_cert_optional=True)
        issuer = _issuer(conf, verifier)
        auth = build_auth(conf)
        process = _Process(conf, verifier, monitor)
        app = make_app(
            verifier,
            pem,
            auth,
            issuer=issuer,
            policy_max_bytes=group.policy_max_bytes,
            routes=_extra_routes(verifier, monitor),
            instances=build_instances(conf, auth),
        )
        await _service.serve(
            app,
            group.host,
            group.port,
            ctx,
            on_start=process.start,
            on_stop=process.stop,
        )

    return _service.run(_main, conf, "trusted-verifier")
