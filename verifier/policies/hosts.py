"""Rules of the compute host API (``/v1/hosts``, trusted compute pools).

Hosts belong to no project: only the cloud administrator and services
(the Nova listener, the operator's tooling) enrol, read and delete them.
A project member gets 403, whatever its project.
"""

from __future__ import annotations

from oslo_policy import policy

from verifier.policies.base import ADMIN, SERVICE

_OPERATOR = f"{ADMIN} or {SERVICE}"


def _rule(
    action: str, description: str, method: str, path: str
) -> policy.DocumentedRuleDefault:
    return policy.DocumentedRuleDefault(
        name=f"attestation:host:{action}",
        check_str=_OPERATOR,
        description=description,
        operations=[{"path": path, "method": method}],
        scope_types=["project"],
    )


_RULES = [
    _rule("create", "Enrol a compute host for attestation (no project owns it).",
          "POST", "/v1/hosts"),
    _rule("list", "List the enrolled compute hosts and their verdicts.",
          "GET", "/v1/hosts"),
    _rule("get", "Show a compute host, its verdict and its guests.",
          "GET", "/v1/hosts/{host}"),
    _rule("delete", "Stop attesting a compute host and forget it (its trait "
          "goes).", "DELETE", "/v1/hosts/{host}"),
    _rule("place", "Report the compute host a node's instance runs on now "
          "(the Nova listener).", "PUT", "/v1/nodes/{uuid}/host"),
]  # fmt: skip


def list_rules() -> list[policy.RuleDefault]:
    return list(_RULES)
