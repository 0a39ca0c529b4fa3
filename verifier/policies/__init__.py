"""Policy in code: who may call which verifier API (oslo.policy).

Each API operation is one rule named ``attestation:<resource>:<action>``
whose default a deployment may override in a policy file
(``oslopolicy-sample-generator --namespace trusted-cloud`` writes the
defaults; ``doc/source/admin/policy.rst`` lists them). Handlers never look
at roles: the API layer (:mod:`verifier.api.authz`) authorizes each
request against its rule and hands the handler the caller's project, or
``None`` when ``attestation:all_projects`` lets the caller see every
project's resources.

Entry points: ``oslo.policy.policies`` (:func:`list_rules`) and
``oslo.policy.enforcer`` (:func:`get_enforcer`).
"""

from __future__ import annotations

import itertools

from oslo_config import cfg
from oslo_policy import policy

from verifier.policies import base, hosts, nodes, resources
from verifier.policies.base import ALL_PROJECTS

__all__ = ["ALL_PROJECTS", "get_enforcer", "list_rules", "make_enforcer"]


def list_rules() -> list[policy.RuleDefault]:
    """Every default rule (the ``oslo.policy.policies`` entry point)."""
    return list(
        itertools.chain(
            base.list_rules(),
            nodes.list_rules(),
            resources.list_rules(),
            hosts.list_rules(),
        )
    )


def make_enforcer(conf: cfg.ConfigOpts) -> policy.Enforcer:
    """An enforcer with our defaults registered; ``[oslo_policy]`` of
    ``conf`` names an operator's overrides."""
    enforcer = policy.Enforcer(conf)
    enforcer.register_defaults(list_rules())
    return enforcer


def get_enforcer() -> policy.Enforcer:
    """The ``oslo.policy.enforcer`` entry point (``oslopolicy-checker``,
    ``oslopolicy-policy-upgrade``, ``oslopolicy-list-redundant``)."""
    conf = cfg.ConfigOpts()
    conf([], project="trusted-cloud")
    return make_enforcer(conf)
