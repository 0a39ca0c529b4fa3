"""Rules of the node API (``/v1/nodes``)."""

from __future__ import annotations

from oslo_policy import policy

from verifier.policies.base import (
    ADMIN,
    MONITORING,
    PROJECT_MEMBER,
    PROJECT_READER,
    SERVICE,
)

_READ = f"{ADMIN} or {SERVICE} or {PROJECT_READER}"
_WRITE = f"{ADMIN} or {PROJECT_MEMBER}"


def _rule(
    action: str, check: str, description: str, method: str, path: str
) -> policy.DocumentedRuleDefault:
    return policy.DocumentedRuleDefault(
        name=f"attestation:node:{action}",
        check_str=check,
        description=description,
        operations=[{"path": path, "method": method}],
        scope_types=["project"],
    )


def _rule_named(
    name: str, check: str, description: str, method: str, path: str
) -> policy.DocumentedRuleDefault:
    return policy.DocumentedRuleDefault(
        name=name,
        check_str=check,
        description=description,
        operations=[{"path": path, "method": method}],
        scope_types=["project"],
    )


_RULES = [
    _rule("create", _WRITE, "Enrol a node (the caller's project owns it).",
          "POST", "/v1/nodes"),
    _rule("list", _READ, "List the nodes of the caller's project.",
          "GET", "/v1/nodes"),
    _rule("get", _READ, "Show a node.", "GET", "/v1/nodes/{uuid}"),
    _rule("delete", f"{_WRITE} or {SERVICE}", "Stop attesting a node and forget it.",
          "DELETE", "/v1/nodes/{uuid}"),
    _rule("revoke", _WRITE, "Revoke a node.", "POST", "/v1/nodes/{uuid}/revoke"),
    _rule("set_policy", _WRITE,
          "Change the runtime or measured-boot policy in force on a node.",
          "PUT", "/v1/nodes/{uuid}/policy"),
    _rule("instance_created", f"{ADMIN} or {SERVICE}",
          "Report that Nova created a node's instance (the Nova listener).",
          "POST", "/v1/nodes/{uuid}/instance-created"),
    _rule("capability", f"{_WRITE} or role:capability",
          "Issue a capability for an attested node.",
          "POST", "/v1/nodes/{uuid}/capabilities"),
    _rule("history", _READ,
          "Read a node's entries in the attestation log, with their proofs "
          "(by the entries' project: a deleted node's history stays).",
          "GET", "/v1/nodes/{uuid}/history"),
    _rule("stats", MONITORING,
          "Read the verifier's counters (of every project).", "GET", "/v1/stats"),
    _rule_named("attestation:metrics:get", MONITORING,
                "Scrape a service's Prometheus metrics (no project or node "
                "is named in them).", "GET", "/metrics"),
]  # fmt: skip


def list_rules() -> list[policy.RuleDefault]:
    return list(_RULES)
