"""Configuration of the registrar and verifier services."""

from oslo_config import cfg

from verifier.conf import (
    abe,
    keyservice,
    monitor,
    notifiers,
    placement,
    push,
    quota,
    registrar,
    verifier,
)

CONF = cfg.CONF


def register_opts(conf: cfg.ConfigOpts) -> None:
    registrar.register_opts(conf)
    verifier.register_opts(conf)
    keyservice.register_opts(conf)
    notifiers.register_opts(conf)
    monitor.register_opts(conf)
    abe.register_opts(conf)
    quota.register_opts(conf)
    push.register_opts(conf)
    placement.register_opts(conf)


__all__ = ["CONF", "register_opts"]
