"""Rules of the policy store, the event log and the attestation helpers."""

from __future__ import annotations

from oslo_policy import policy

from verifier.policies.base import ADMIN, PROJECT_MEMBER, PROJECT_READER, SERVICE

_READ = f"{ADMIN} or {SERVICE} or {PROJECT_READER}"
_WRITE = f"{ADMIN} or {PROJECT_MEMBER}"
#: Any reader of any project (the log's hashes and checkpoints name no node).
_ANY = f"{ADMIN} or {SERVICE} or role:reader"


def _rule(
    name: str, check: str, description: str, method: str, path: str
) -> policy.DocumentedRuleDefault:
    return policy.DocumentedRuleDefault(
        name=f"attestation:{name}",
        check_str=check,
        description=description,
        operations=[{"path": path, "method": method}],
        scope_types=["project"],
    )


_RULES = [
    _rule("policy:create", _WRITE,
          "Store a runtime or measured-boot policy (owned by the caller's project).",
          "POST", "/v1/policies/{kind}"),
    _rule("policy:list", _READ, "List the caller's project's policies.",
          "GET", "/v1/policies/{kind}"),
    _rule("policy:get", _READ, "Show a policy.", "GET", "/v1/policies/{kind}/{ref}"),
    _rule("policy:delete", _WRITE, "Delete a policy.",
          "DELETE", "/v1/policies/{kind}/{ref}"),
    policy.DocumentedRuleDefault(
        name="attestation:policy:check",
        check_str=_WRITE,
        description=(
            "Dry-run a runtime policy (stored, or a document sent with the "
            "request and not stored) on the caller's project's nodes: each "
            "node's agent is asked for a fresh quote and its whole IMA list "
            "(a cost to every node checked, so members only); nothing changes."
        ),
        operations=[
            {"path": "/v1/policies/runtime/{ref}/check", "method": "POST"},
            {"path": "/v1/policies/runtime/check", "method": "POST"},
        ],
        scope_types=["project"],
    ),
    _rule("registration:get", _READ,
          "Show a node's registration at the registrar (a project sees "
          "only its own instances, as Nova shows them).",
          "GET", "/v1/agents/{uuid}"),
    _rule("registration:list", _READ,
          "List registrations at the registrar (a project sees only its "
          "own instances).", "GET", "/v1/agents"),
    _rule("secret:create", _WRITE,
          "Store a secret at the key service for the caller's project (its "
          "attested nodes read it with a capability).",
          "PUT", "/v1/secrets/{name}"),
    _rule("group:list", _READ,
          "List the key service's LKH groups of the caller's project (admin: "
          "every project's).", "GET", "/v1/groups"),
    _rule("group:get", _READ, "Show an LKH group of the caller's project.",
          "GET", "/v1/groups/{gid}"),
    _rule("filegroup:list", _READ,
          "List the key service's filegroups of the caller's project (admin: "
          "every project's).", "GET", "/v1/filegroups"),
    _rule("filegroup:get", _READ, "Show a filegroup of the caller's project.",
          "GET", "/v1/filegroups/{fg}"),
    _rule("event:list", _READ, "Read the revocation events of the project's nodes.",
          "GET", "/v1/events"),
    _rule("log:checkpoint", _ANY,
          "Read the attestation log's latest signed checkpoint (any "
          "caller with a role: it names no node).",
          "GET", "/v1/log/checkpoint"),
    _rule("log:consistency", _ANY,
          "Read a consistency proof between two sizes of the attestation "
          "log (hashes only).", "GET", "/v1/log/consistency"),
    _rule("abe:params", _READ, "Read the CP-ABE public parameters.",
          "GET", "/v1/abe/params"),
    _rule("node:relay", _WRITE,
          "Relay an identity quote or U to a push node through the verifier.",
          "POST", "/v1/nodes/{uuid}/relay/*"),
    _rule("monitor:attest", f"{_READ} or role:monitor",
          "Quote the verifier host's TPM (monitor attestation).",
          "GET", "/v1/monitor/*"),
]  # fmt: skip


def list_rules() -> list[policy.RuleDefault]:
    return list(_RULES)
