"""Entry point for oslo-config-generator (namespace ``verifier``)."""

from oslo_config import cfg

from verifier.conf import abe, monitor, registrar, verifier


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return (
        registrar.list_opts()
        + verifier.list_opts()
        + monitor.list_opts()
        + abe.list_opts()
    )
