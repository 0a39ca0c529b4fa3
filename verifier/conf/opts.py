"""Entry point for oslo-config-generator (namespace ``verifier``)."""

from oslo_config import cfg

from verifier.conf import nova_listener, registrar, verifier


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return registrar.list_opts() + verifier.list_opts() + nova_listener.list_opts()
