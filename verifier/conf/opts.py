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


# One namespace per service (setup.cfg ``oslo.config.opts``), for its own
# sample file (etc/oslo-config-generator/<service>.conf).


def list_registrar_opts() -> list[tuple[str, list[cfg.Opt]]]:
    """``trusted-registrar``'s own options (namespace
    ``trusted-cloud.registrar``)."""
    return registrar.list_opts()


def list_verifier_opts() -> list[tuple[str, list[cfg.Opt]]]:
    """``trusted-verifier``'s own options (namespace
    ``trusted-cloud.verifier``): the capabilities it issues are its own."""
    capabilities = [
        (group, opts)
        for group, opts in keyservice.list_opts()
        if group == keyservice.CAP_GROUP
    ]
    return (
        verifier.list_opts()
        + notifiers.list_opts()
        + monitor.list_opts()
        + abe.list_opts()
        + quota.list_opts()
        + push.list_opts()
        + placement.list_opts()
        + capabilities
    )


def list_keyservice_opts() -> list[tuple[str, list[cfg.Opt]]]:
    """``trusted-keyservice``'s own options (namespace
    ``trusted-cloud.keyservice``)."""
    return [
        (group, opts)
        for group, opts in keyservice.list_opts()
        if group == keyservice.GROUP
    ]


def list_nova_listener_opts() -> list[tuple[str, list[cfg.Opt]]]:
    """``trusted-nova-listener``'s own options (namespace
    ``trusted-cloud.nova_listener``)."""
    return nova_listener.list_opts()
