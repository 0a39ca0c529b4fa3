"""``trusted-registrar``: the registrar service."""

from __future__ import annotations

from verifier import db
from verifier.cmd import _service
from verifier.common import tls as tlsutil
from verifier.exceptions import ConfigError
from verifier.protocol import MalformedError
from verifier.protocol.ekcert import load_anchors
from verifier.registrar import Registrar, make_app


def main(argv: list[str] | None = None) -> int:
    conf = _service.setup(argv, "trusted-registrar")
    group = conf.registrar

    async def _main() -> None:
        _service.require(group, "cert_file", "key_file", "ca_file")
        anchors = []
        if group.ek_ca_bundle:
            try:
                with open(group.ek_ca_bundle, "rb") as f:
                    anchors = load_anchors(f.read())
            except (OSError, MalformedError) as exc:
                raise ConfigError(f"[registrar] ek_ca_bundle: {exc}")
        engine = db.make_engine(group.database_connection)
        db.upgrade(engine)
        registrar = Registrar(engine, anchors, group.require_ek_certificate)
        ctx = tlsutil.server_context(
            group.cert_file, group.key_file, group.ca_file, client_cert_optional=True
        )
        roles = {
            "agent": group.agent_clients,
            "reader": group.reader_clients,
            "admin": group.admin_clients,
            "provider": group.provider_clients,
        }
        app = make_app(registrar, roles)
        await _service.serve(app, group.host, group.port, ctx)

    return _service.run(_main)
