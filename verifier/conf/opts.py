"""Entry point for oslo-config-generator (namespace ``verifier``)."""

from oslo_config import cfg

from verifier.conf import (
    abe,
    keyservice,
    monitor,
    notifiers,
    nova_listener,
    placement,
    push,
    quota,
    registrar,
    verifier,
)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return (
        registrar.list_opts()
        + verifier.list_opts()
        + keyservice.list_opts()
        + notifiers.list_opts()
        + monitor.list_opts()
        + abe.list_opts()
        + nova_listener.list_opts()
        + quota.list_opts()
        + push.list_opts()
        + placement.list_opts()
    )
