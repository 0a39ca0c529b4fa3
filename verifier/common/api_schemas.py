"""JSON schemas of the success bodies of the services' main routes, for
their OpenAPI documents (:mod:`verifier.common.openapi`), so that
schemathesis's ``response_schema_conformance`` check judges successes as
well as refusals.

Each map is keyed by ``(METHOD, path as routed)``. A schema names every
field the service always sends (``required``) with its JSON type; more
fields may be added later without breaking clients
(``additionalProperties`` stays open).
"""

from __future__ import annotations

from typing import Any

__all__ = ["AGENT", "LISTENER", "REGISTRAR", "VERIFIER", "Responses"]

#: (METHOD, route path) -> schema of the 2xx body.
Responses = dict[tuple[str, str], dict[str, Any]]

_STR = {"type": "string"}
_INT = {"type": "integer", "minimum": 0}
_NULL_STR = {"type": "string", "nullable": True}
_NULL_NUM = {"type": "number", "nullable": True}
_NULL_INT = {"type": "integer", "nullable": True}
_STATES = [
    "pending",
    "created",
    "registered",
    "bootstrapping",
    "attested",
    "failed",
    "unreachable",
    "revoked",
]


def _object(required: dict[str, Any], **optional: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "required": sorted(required),
        "properties": {**required, **optional},
    }


#: A policy in force on a node (null: none of that kind).
_IN_FORCE = {
    **_object(
        {
            "name": _NULL_STR,
            "version": _NULL_INT,
            "digest": _STR,
            "follows": {"type": "boolean"},
        }
    ),
    "nullable": True,
}
_NODE = _object(
    {
        "uuid": _STR,
        "state": {"type": "string", "enum": [*_STATES, "host_untrusted"]},
        "policy": {"type": "object"},
        "failure_reason": _NULL_STR,
        "last_attested_at": {
            "type": "string",
            "format": "date-time",
            "nullable": True,
        },
        "last_attested_age": _NULL_NUM,
        "trusted": {"type": "boolean"},
        "quotes_verified": _INT,
        "runtime_policy": _NULL_STR,
        "mb_policy": _NULL_STR,
        "ima_entries": _NULL_INT,
        "project_id": _STR,
        "policies": _object({"runtime": _IN_FORCE, "measured-boot": _IN_FORCE}),
    },
    interval=_NULL_NUM,
    host={
        **_object(
            {
                "name": _STR,
                "trusted": {"type": "boolean", "nullable": True},
                "as_of": _NULL_STR,
            }
        ),
        "nullable": True,
    },
)
#: A compute host (trusted compute pools).
_HOST = _object(
    {
        "uuid": _STR,
        "provider": _STR,
        "hypervisor_hostname": _STR,
        "state": {"type": "string", "enum": _STATES},
        "failure_reason": _NULL_STR,
        "trusted": {"type": "boolean", "nullable": True},
        "as_of": _NULL_STR,
        "ca_path": _STR,
        "ca_sha256": _NULL_STR,
        "last_attested_at": _NULL_STR,
        "quotes_verified": _INT,
        "last_round": {
            **_object({"at": _STR, "guests": _INT, "root": _STR}),
            "nullable": True,
        },
    },
    guests={"type": "array", "items": _STR},
)
_SIGNED_EVENT = _object(
    {
        "event": _object(
            {
                "id": _STR,
                "node_uuid": _STR,
                "reason": _STR,
                "detail": _STR,
                "created_at": _STR,
                "type": {
                    "type": "string",
                    "enum": [
                        "node.revoked",
                        "node.failed",
                        "node.unreachable",
                        "node.recovered",
                        "node.policy_changed",
                        "node.host_untrusted",
                    ],
                },
                "version": _INT,
            }
        ),
        "signature": _STR,
        "key_id": _STR,
    }
)
_OUTBOX_ENTRY = _object(
    {
        "id": _STR,
        "node_uuid": _STR,
        "type": _STR,
        "reason": _STR,
        "detail": _STR,
        "created_at": _STR,
        "signed_event": _SIGNED_EVENT,
        "delivered": {"type": "boolean"},
        "attempts": _INT,
        "last_error": _NULL_STR,
    }
)

_POLICY_CHECK = _object(
    {
        "policy": _object({"name": _STR, "version": _INT, "digest": _STR}),
        "results": {
            "type": "array",
            "items": _object(
                {
                    "node": _STR,
                    "result": {"type": "string", "enum": ["pass", "fail", "error"]},
                    "entries": _INT,
                    "failures": {
                        "type": "array",
                        "items": _object(
                            {
                                "index": _INT,
                                "path": _STR,
                                "reason": _STR,
                                "detail": _STR,
                            }
                        ),
                    },
                    "failures_total": _INT,
                    "error": _NULL_STR,
                }
            ),
        },
    }
)

_B64_LIST = {"type": "array", "items": _STR}
#: One entry of a node's attestation log history, and its inclusion proof.
_HISTORY_ITEM = _object(
    {
        "entry": _object(
            {
                "index": _INT,
                "prev": _NULL_INT,
                "node_uuid": _STR,
                "project_id": _STR,
                "kind": _STR,
                "reason": _STR,
                "detail": _STR,
                "created_at": {"type": "number"},
                "event_id": _NULL_STR,
            }
        ),
        "proof": _B64_LIST,
    }
)

#: The verifier's routes.
VERIFIER: Responses = {
    ("GET", "/v1/nodes/{uuid}/history"): _object(
        {
            "node_uuid": _STR,
            "checkpoint": _STR,
            "tree_size": _INT,
            "last": _NULL_INT,
            "complete_from": _INT,
            "entries": {"type": "array", "items": _HISTORY_ITEM},
        }
    ),
    ("GET", "/v1/log/consistency"): _object(
        {"from": _INT, "to": _INT, "proof": _B64_LIST}
    ),
    ("POST", "/v1/nodes"): _NODE,
    ("GET", "/v1/nodes"): _object({"nodes": {"type": "array", "items": _NODE}}),
    ("GET", "/v1/nodes/{uuid}"): _NODE,
    ("POST", "/v1/nodes/{uuid}/revoke"): _NODE,
    ("PUT", "/v1/nodes/{uuid}/policy"): _NODE,
    ("POST", "/v1/nodes/{uuid}/instance-created"): _NODE,
    ("GET", "/v1/events"): _object(
        {
            "events": {"type": "array", "items": _OUTBOX_ENTRY},
            "links": {
                "type": "array",
                "items": _object({"rel": _STR, "href": _STR}),
            },
        }
    ),
    ("POST", "/v1/hosts"): _HOST,
    ("GET", "/v1/hosts"): _object({"hosts": {"type": "array", "items": _HOST}}),
    ("GET", "/v1/hosts/{host}"): _HOST,
    ("PUT", "/v1/nodes/{uuid}/host"): _object({"uuid": _STR, "host": _STR}),
    ("POST", "/v1/policies/runtime/{ref}/check"): _POLICY_CHECK,
    ("POST", "/v1/policies/runtime/check"): _POLICY_CHECK,
    ("GET", "/v1/stats"): _object(
        {
            "nodes": _INT,
            "states": _object({s: _INT for s in _STATES}),
            "owned": _INT,
            "member": _STR,
            "quotes_verified": _INT,
            "outbox": _object(
                {"pending": _INT, "oldest_pending_age": {"type": ["number", "null"]}}
            ),
        }
    ),
}

_HOST_TRUST = _object(
    {
        "host": _STR,
        "applied": {"type": "boolean"},
        "trusted": {"type": "boolean"},
        "ca_sha256": _NULL_STR,
        "provider": _NULL_STR,
        "as_of": _NULL_STR,
    }
)

#: A node's registration (``GET /v1/agents/{uuid}``).
_REGISTRATION = _object(
    {
        "uuid": _STR,
        "ek_public": _STR,
        "ek_certificate": _NULL_STR,
        "ak_public": _STR,
        "tls_cert": _STR,
        "host": _STR,
        "port": {"type": "integer", "minimum": 0, "maximum": 65535},
        "activated": {"type": "boolean"},
    }
)

#: The registrar's routes.
REGISTRAR: Responses = {
    ("GET", "/v1/agents"): _object(
        {
            "agents": {
                "type": "array",
                "items": _object({"uuid": _STR, "activated": {"type": "boolean"}}),
            }
        }
    ),
    ("GET", "/v1/agents/{uuid}"): _REGISTRATION,
    ("POST", "/v1/lookup/agents"): _object(
        {
            "agents": {"type": "array", "items": _REGISTRATION},
            "placements": {"type": "object", "additionalProperties": _STR},
        }
    ),
    ("PUT", "/v1/hosts/{host}/trust"): _HOST_TRUST,
    ("GET", "/v1/hosts/{host}/trust"): _HOST_TRUST,
}

#: The node agent's routes.
AGENT: Responses = {
    ("GET", "/v1/status"): _object(
        {
            "uuid": _STR,
            "bootstrapped": {"type": "boolean"},
            "has_u": {"type": "boolean"},
            "has_v": {"type": "boolean"},
            "payload_exit_code": _NULL_INT,
            "last_error": _NULL_STR,
        }
    ),
}

#: The revocation listener's routes.
LISTENER: Responses = {
    ("GET", "/v1/stats"): _object(
        {
            name: _INT
            for name in (
                "received",
                "handled",
                "duplicates",
                "dead_lettered",
                "malformed",
                "bad_signature",
                "state_errors",
                "redriven",
            )
        }
    ),
}
