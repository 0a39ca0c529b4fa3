"""Options of the key service (group ``keyservice``) and of the verifier's
side of capabilities (group ``capabilities``)."""

from oslo_config import cfg

GROUP = "keyservice"
CAP_GROUP = "capabilities"

_OPTS = [
    cfg.HostAddressOpt("host", default="127.0.0.1", help="Address to listen on."),
    cfg.PortOpt("port", default=8893, help="Port to listen on (HTTPS, mTLS)."),
    cfg.StrOpt("cert_file", help="PEM certificate the key service presents."),
    cfg.StrOpt("key_file", help="PEM private key of cert_file."),
    cfg.StrOpt(
        "ca_file",
        help="PEM CA bundle for clients: the operator CA (tenant, verifier) "
        "and the verifier's node identity CA (nodes).",
    ),
    cfg.StrOpt(
        "capability_key_file",
        help="32-byte capability MAC key shared with the verifier (created "
        "0600 if missing).",
    ),
    cfg.StrOpt(
        "event_public_key_file",
        help="PEM Ed25519 public key of the verifier's revocation events "
        "(GET /v1/signing-key on the verifier).",
    ),
    cfg.StrOpt(
        "signing_key",
        help="PEM Ed25519 key that signs LKH rekey messages (created if missing).",
    ),
    cfg.StrOpt(
        "state_file",
        default="/var/lib/trusted-cloud/keyservice.json",
        help="Durable state: node epochs, handled events, secrets, filegroups.",
    ),
    cfg.IntOpt("lkh_degree", default=4, min=2, help="Children per LKH tree node."),
    cfg.StrOpt(
        "auth_strategy",
        default="noauth",
        choices=[
            (
                "keystone",
                "tenants store secrets with Keystone tokens "
                "([keystone_authtoken]), each in its own project; what a "
                "cloud runs",
            ),
            (
                "noauth",
                "no Keystone: each tenant_clients certificate stores secrets "
                "of the project named by its CN (the embedded demo and tests "
                "only)",
            ),
        ],
        help="How tenants authenticate to PUT /v1/secrets. A node gets only "
        "the secrets of the project its capability names (the verifier "
        "puts the node's project in it).",
    ),
    cfg.ListOpt(
        "tenant_clients",
        default=["tenant"],
        help="Client certificate CNs allowed to store secrets and read stats.",
    ),
    cfg.ListOpt(
        "verifier_clients",
        default=["verifier"],
        help="Client certificate CNs allowed to post revocation events.",
    ),
    cfg.ListOpt(
        "metrics_clients",
        default=[],
        help="Client certificate CNs allowed to scrape GET /metrics "
        "(Prometheus; doc/source/admin/monitoring.rst).",
    ),
]

_CAP_OPTS = [
    cfg.StrOpt(
        "key_file",
        help="The capability MAC key shared with the key service. When set, "
        "the verifier issues capabilities to attested nodes.",
    ),
    cfg.IntOpt("ttl", default=300, min=1, help="Seconds a capability stays valid."),
    cfg.StrOpt(
        "keyservice_url",
        help="Key service base URL; when set, the 'keyservice' notifier posts "
        "every revocation event there (with the verifier's client certificate).",
    ),
    cfg.ListOpt(
        "clients",
        default=["agent"],
        help="Client certificate CNs (besides tenants) allowed to ask for "
        "capabilities of attested nodes.",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(_OPTS, group=GROUP)
    conf.register_opts(_CAP_OPTS, group=CAP_GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(GROUP, _OPTS), (CAP_GROUP, _CAP_OPTS)]
