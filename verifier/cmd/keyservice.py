"""``trusted-keyservice``: secrets, group keys and filegroup keys behind
capabilities issued by the verifier; revoked by the verifier's signed
events."""

from __future__ import annotations

from verifier.api.authz import Auth
from verifier.api.verifier_app import public_pem
from verifier.cmd import _service
from verifier.cmd.verifier import load_signing_key
from verifier.common import version
from verifier.keyservice import KeyService, make_app
from verifier.keyservice.keys import load_mac_key, load_public_key
from verifier.policies import make_enforcer


def main(argv: list[str] | None = None) -> int:
    version.exit_if_asked(argv, "trusted-keyservice")
    conf = _service.setup(argv, "trusted-keyservice")
    group = conf.keyservice

    async def _main() -> None:
        _service.require_options(
            group,
            "cert_file",
            "key_file",
            "ca_file",
            "capability_key_file",
            "event_public_key_file",
            "signing_key",
        )
        signing_key = load_signing_key(group.signing_key)
        service = KeyService(
            load_mac_key(group.capability_key_file),
            [load_public_key(group.event_public_key_file)],
            signing_key,
            state_file=group.state_file,
            degree=group.lkh_degree,
        )
        # no certificate needed to connect (tokens, load balancers'
        # /healthcheck); every guarded route still needs an identity (401)
        ctx = _service.server_tls(group, client_cert_optional=True)
        roles = {
            "tenant": group.tenant_clients,
            "verifier": group.verifier_clients,
            "metrics": group.metrics_clients,
        }
        auth = None
        if group.auth_strategy == "keystone":
            from verifier.api.keystone import KeystoneAuthenticator

            auth = Auth(make_enforcer(conf), KeystoneAuthenticator(conf))
        pem = public_pem(signing_key.public_key())
        app = make_app(service, pem, roles, auth)
        await _service.serve(app, group.host, group.port, ctx)

    return _service.run(_main, conf, "trusted-keyservice")
