"""``trusted-registrar``: the registrar service."""

from __future__ import annotations

from oslo_config import cfg

from verifier import db
from verifier.api.authz import Auth
from verifier.attest.instances import NovaInstanceOwners
from verifier.cmd import _service
from verifier.common import tls as tlsutil
from verifier.common import version
from verifier.common.http import AsyncClient
from verifier.exceptions import ConfigError
from verifier.policies import make_enforcer
from verifier.protocol import MalformedError
from verifier.protocol.ekcert import load_anchors
from verifier.protocol.hosttrust import HostTrustMode
from verifier.registrar import Registrar, make_app


def _build_auth(conf: cfg.ConfigOpts) -> tuple[Auth | None, NovaInstanceOwners | None]:
    """With ``[registrar] auth_strategy = keystone``: Keystone tokens on
    the read side, scoped by asking Nova whose an instance is (its
    endpoint trusted with the system's CAs and ``ca_file``), unless
    ``instance_owner_check = none`` (no Nova: not scoped)."""
    group = conf.registrar
    if group.auth_strategy != "keystone":
        return None, None
    from verifier.api.keystone import KeystoneAuthenticator

    auth = Auth(make_enforcer(conf), KeystoneAuthenticator(conf))
    context = tlsutil.client_context(None, None, None)
    if group.ca_file:
        context.load_verify_locations(group.ca_file)
    if group.instance_owner_check == "none":
        return auth, None
    return auth, NovaInstanceOwners(AsyncClient(context, 10.0), group.compute_interface)


def main(argv: list[str] | None = None) -> int:
    version.exit_if_asked(argv, "trusted-registrar")
    conf = _service.setup(argv, "trusted-registrar")
    group = conf.registrar

    async def _main() -> None:
        _service.require_options(group, "cert_file", "key_file", "ca_file")
        anchors = []
        if group.ek_ca_bundle:
            try:
                with open(group.ek_ca_bundle, "rb") as f:
                    anchors = load_anchors(f.read())
            except (OSError, MalformedError) as exc:
                raise ConfigError(f"[registrar] ek_ca_bundle: {exc}")
        engine = db.make_engine(group.database_connection)
        db.upgrade(engine)
        registrar = Registrar(
            engine,
            anchors,
            group.require_ek_certificate,
            host_trust=HostTrustMode(group.host_trust),
        )
        ctx = _service.server_tls(group, client_cert_optional=True)
        roles = {
            "agent": group.agent_clients,
            "reader": group.reader_clients,
            "admin": group.admin_clients,
            "provider": group.provider_clients,
            "metrics": group.metrics_clients,
            "verifier": group.verifier_clients,
        }
        auth, instances = _build_auth(conf)
        app = make_app(
            registrar,
            roles,
            auth,
            instances,
            unscoped=conf.registrar.instance_owner_check == "none",
        )
        await _service.serve(app, group.host, group.port, ctx)

    return _service.run(_main, conf, "trusted-registrar")
