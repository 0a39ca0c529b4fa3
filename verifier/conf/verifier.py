"""Options of the cloud verifier (group ``verifier``)."""

from oslo_config import cfg

GROUP = "verifier"

_OPTS = [
    cfg.HostAddressOpt("host", default="127.0.0.1", help="Address to listen on."),
    cfg.PortOpt("port", default=8881, help="Port to listen on (HTTPS, mTLS)."),
    cfg.StrOpt(
        "database_connection",
        default="sqlite:////var/lib/trusted-cloud/verifier.sqlite",
        help="SQLAlchemy URL of the verifier's database.",
    ),
    cfg.StrOpt(
        "cert_file",
        help="PEM certificate the verifier presents (as "
        "server, and as client to the registrar and agents).",
    ),
    cfg.StrOpt("key_file", help="PEM private key of cert_file."),
    cfg.StrOpt("ca_file", help="PEM CA bundle for clients and the registrar."),
    cfg.StrOpt(
        "auth_strategy",
        default="noauth",
        choices=[
            (
                "keystone",
                "tenants authenticate with Keystone tokens "
                "([keystone_authtoken]); what a cloud runs",
            ),
            (
                "noauth",
                "no Keystone: each tenant_clients certificate is a "
                "tenant whose project is its CN (the embedded demo and tests only)",
            ),
        ],
        help="How tenants authenticate to the verifier's API. Machine "
        "identities (operator_clients, capability and monitor clients) use "
        "their client certificates in both; authorization follows the "
        "policy rules (oslo.policy, [oslo_policy] policy_file).",
    ),
    cfg.StrOpt(
        "instance_owner_check",
        default="nova",
        choices=[
            (
                "nova",
                "ask Nova, with the caller's token, that the instance "
                "exists in the caller's project",
            ),
            ("none", "no check (nodes that are not Nova instances)"),
        ],
        help="auth_strategy keystone only: how an enrolment's instance UUID "
        "is tied to the enrolling project. Without a check, a project can "
        "claim another's instance ahead of its owner.",
    ),
    cfg.StrOpt(
        "compute_interface",
        default="public",
        help="The endpoint interface of Nova's catalog entry to use for "
        "instance_owner_check.",
    ),
    cfg.ListOpt(
        "tenant_clients",
        default=["tenant"],
        help="auth_strategy noauth only: client certificate common names "
        "that are tenants, each the project named by its CN (reader and "
        "member roles). Ignored with keystone.",
    ),
    cfg.ListOpt(
        "operator_clients",
        default=["operator"],
        help="Client certificate common names of provider-side services (the "
        "Nova notification listener): they hold the 'service' role of the "
        "policy (mark a node's instance created, read and delete nodes).",
    ),
    cfg.ListOpt(
        "observer_clients",
        default=[],
        help="Client certificate common names of monitoring clients (a "
        "Prometheus scraper, an operator's dashboard): they hold the "
        "'attestation_observer' role of the policy (read /v1/stats and "
        "/metrics, nothing else).",
    ),
    cfg.URIOpt(
        "registrar_url",
        default="https://127.0.0.1:8891",
        help="Base URL of the registrar.",
    ),
    cfg.FloatOpt(
        "quote_interval",
        default=2.0,
        min=0.0,
        help="Seconds between integrity quotes of one node, unless its "
        "enrolment gave it its own interval (its verification class).",
    ),
    cfg.FloatOpt(
        "min_node_interval",
        default=1.0,
        min=0.1,
        max=86400.0,
        help="The shortest quote interval a tenant may give a node at "
        "enrolment (the 'interval' field; shorter is refused with 400 "
        "interval_too_short). Under overload every class is slowed by the "
        "same factor (earliest virtual deadline first).",
    ),
    cfg.FloatOpt(
        "agent_timeout",
        default=5.0,
        min=0.1,
        help="Seconds to wait for an agent's answer.",
    ),
    cfg.FloatOpt(
        "agent_keep_alive",
        default=15.0,
        min=0.0,
        max=25.0,
        help="A node quoted at most this many seconds apart keeps its "
        "connection open between rounds; a node with a longer interval "
        "(or backed off) is reconnected for each round, so that a large "
        "fleet watched slowly holds no idle TLS connections (tens of KB "
        "each). At most 25 s: idle connections are dropped after 30 s.",
    ),
    cfg.IntOpt(
        "max_unreachable",
        default=5,
        min=1,
        help="Consecutive unanswered quote requests (or push deadlines) "
        "before a node is marked unreachable: not trusted, a node.unreachable "
        "event, still polled; a good quote brings it back with a "
        "node.recovered event.",
    ),
    cfg.IntOpt(
        "max_in_flight",
        default=512,
        min=1,
        help="At most this many quote requests are in flight at once.",
    ),
    cfg.StrOpt(
        "coordination_url",
        help="tooz backend URL (e.g. redis://127.0.0.1:6379?membership_timeout=2) "
        "when several verifier processes share one database: the nodes are "
        "split between the live members with a consistent hash ring, and a "
        "dead member's nodes go to the others. Unset: this verifier attests "
        "every node.",
    ),
    cfg.StrOpt(
        "coordination_group",
        default="trusted-verifiers",
        help="The tooz group the verifiers of one deployment join (distinct "
        "deployments sharing a backend need distinct groups).",
    ),
    cfg.StrOpt(
        "member_id",
        help="This verifier's name in the coordination group (default: "
        "host name and process id).",
    ),
    cfg.FloatOpt(
        "sync_interval",
        default=1.0,
        min=0.05,
        help="Seconds between syncs with the group and the shared database "
        "(only with coordination_url).",
    ),
    cfg.StrOpt(
        "unreachable_action",
        default="fail",
        choices=[
            ("fail", "mark the node unreachable and keep polling it"),
            ("revoke", "revoke the node and fire the revocation hooks"),
        ],
        help="What happens to a node that missed max_unreachable rounds.",
    ),
    cfg.FloatOpt(
        "trust_window",
        default=0.0,
        min=0,
        help="Seconds a node's last good quote stays fresh: the API calls "
        "an attested node trusted only while its last good quote is at "
        "most this old (a frozen agent stops being trusted before it is "
        "found unreachable). 0: three times the node's quote interval "
        "(plus the challenge lifetime for push nodes), at least 10 s.",
    ),
    cfg.FloatOpt(
        "unreachable_timeout",
        default=900.0,
        min=0,
        help="Seconds a node may stay silent (since its last good quote) "
        "before it is revoked with the reason unreachable_timeout and the "
        "revocation hooks run: longer than a slow reboot or an agent "
        "upgrade, so that those never cost a node its keys, while a node "
        "that goes quiet for good is still cut off. 0: never.",
    ),
    cfg.StrOpt(
        "signing_key",
        help="Ed25519 private key (PEM) that signs "
        "revocation events; created on first start if missing.",
    ),
    cfg.StrOpt(
        "ca_dir",
        help="Directory of the software CA that issues node "
        "identities (ca.pem, ca-key.pem).",
    ),
    cfg.ListOpt(
        "notifiers",
        default=["inprocess"],
        help="Notifier drivers (group verifier.notifiers) that deliver "
        "revocation events.",
    ),
    cfg.FloatOpt(
        "outbox_interval",
        default=0.5,
        min=0.05,
        help="Seconds between outbox delivery passes.",
    ),
    cfg.IntOpt(
        "policy_max_bytes",
        default=64 << 20,
        min=1024,
        help="Largest runtime or measured-boot policy upload accepted "
        "(bytes of JSON); larger uploads are refused with 413.",
    ),
    cfg.IntOpt(
        "policy_max_entries",
        default=5_000_000,
        min=1,
        help="Largest runtime policy accepted (digests, excludes and keys).",
    ),
    cfg.StrOpt(
        "mb_min_dbx_file",
        help="File of the dbx entries every measured-boot policy that pins "
        "the Secure Boot keys (pk) must list in its dbx: the oldest "
        "revocation list the operator accepts. One entry a line "
        "(sha256:<hex>, x509:<sha256 hex>, <type GUID>:<sha256 hex>; "
        "# starts a comment). A policy whose dbx lacks any is refused "
        "with 400 bad_policy. Unset: no minimum.",
    ),
    cfg.ListOpt(
        "policy_signing_keys",
        default=[],
        help="PEM public keys (Ed25519 or ECDSA P-256) trusted to sign "
        "policies. When set, every policy upload must carry a detached "
        "signature over its canonical JSON by one of them "
        "(trusted-ima-policy --sign-key makes one).",
    ),
    cfg.IntOpt(
        "log_retention_days",
        default=0,
        min=0,
        help="Days the attestation log keeps an entry's body (what "
        "happened to a node); older entries keep only their hashes, so "
        "the proofs of younger ones still verify, and a node's history "
        "starts after them (its complete_from says where). 0 keeps every "
        "entry for ever.",
    ),
    cfg.IntOpt(
        "event_retention_days",
        default=0,
        min=0,
        help="Days the events table (GET /v1/events, the outbox of "
        "revocation and other signed events) keeps a delivered event; "
        "older delivered events are deleted once an hour. An event not yet "
        "delivered to every notifier is never deleted. 0 keeps every event "
        "for ever.",
    ),
    cfg.FloatOpt(
        "log_interval",
        default=1.0,
        min=0.05,
        help="Seconds between the attestation log's sequencing passes "
        "(entries staged by other verifier processes); a change committed "
        "by this process is sequenced at once.",
    ),
    cfg.FloatOpt(
        "outbox_retry_delay",
        default=1.0,
        min=0.0,
        help="Seconds before an event that a notifier failed to deliver is "
        "tried again; doubled after each further failure.",
    ),
    cfg.FloatOpt(
        "outbox_max_retry_delay",
        default=60.0,
        min=0.0,
        help="Upper bound of the outbox retry back-off (seconds).",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(_OPTS, group=GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(GROUP, _OPTS)]
