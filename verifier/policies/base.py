"""The personas every rule is written in (Keystone's default roles).

``reader``, ``member`` and ``admin`` are Keystone's default roles (admin
implies member implies reader). A rule's target carries the project that
owns the resource (``project_id``), so ``project_member`` means "a member
of the project that owns it". ``admin`` is the cloud administrator
(Keystone's ``admin`` role is global in OpenStack); ``service`` is a
service user (Keystone's ``service`` role) or a provider-side machine
identity (the Nova listener's certificate). ``observer`` is a monitoring
operator (Keystone role ``attestation_observer``, or a certificate named in
``[verifier] observer_clients``): it reads the counters and metrics of
every project (:data:`MONITORING`) and nothing else.
"""

from __future__ import annotations

from oslo_policy import policy

#: The rule that lets a caller act on every project's resources.
ALL_PROJECTS = "attestation:all_projects"

ADMIN = "rule:admin"
SERVICE = "rule:service"
PROJECT_READER = "rule:project_reader"
PROJECT_MEMBER = "rule:project_member"
PROJECT_ADMIN = "rule:project_admin"
OBSERVER = "rule:observer"
#: The Keystone role of a monitoring operator.
OBSERVER_ROLE = "attestation_observer"
#: Who reads counters and metrics (``/v1/stats``, ``/metrics``): the cloud
#: administrator, services, and monitoring operators.
MONITORING = f"{ADMIN} or {SERVICE} or {OBSERVER}"

_RULES = [
    policy.RuleDefault("admin", "role:admin", "The cloud administrator."),
    policy.RuleDefault(
        "service", "role:service", "A service user or provider-side service."
    ),
    policy.RuleDefault(
        "observer",
        f"role:{OBSERVER_ROLE}",
        "A monitoring operator: reads counters and metrics, nothing else.",
    ),
    policy.RuleDefault(
        "project_reader",
        "role:reader and project_id:%(project_id)s",
        "A reader of the project that owns the resource.",
    ),
    policy.RuleDefault(
        "project_member",
        "role:member and project_id:%(project_id)s",
        "A member of the project that owns the resource.",
    ),
    policy.RuleDefault(
        "project_admin",
        "role:admin and project_id:%(project_id)s",
        "An administrator of the project that owns the resource.",
    ),
    policy.DocumentedRuleDefault(
        name=ALL_PROJECTS,
        check_str=f"{ADMIN} or {SERVICE} or role:capability",
        description="Act on the nodes, policies and events of every project "
        "(otherwise only on those of the caller's project). Capability "
        "clients (node agents asking for their own node) need it to find "
        "the node; the other rules still decide what they may do.",
        operations=[{"path": "/v1/*", "method": "GET"}],
        scope_types=["project"],
    ),
]


def list_rules() -> list[policy.RuleDefault]:
    return list(_RULES)
