"""An open :class:`verifier.api.authz.Auth` for in-process API tests that
run without TLS: every caller is a ``noauth`` caller with every role."""

from __future__ import annotations

from oslo_config import cfg

from verifier.api.authz import Auth
from verifier.policies import make_enforcer

__all__ = ["open_auth"]


def open_auth() -> Auth:
    """The policy defaults in code, enforced for an all-roles caller."""
    conf = cfg.ConfigOpts()
    conf([], project="trusted-cloud")
    return Auth(make_enforcer(conf), open_without_tls=True)
