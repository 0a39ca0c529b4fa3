"""Options of the ``[action_vault]`` group: the ``vault`` action."""

from __future__ import annotations

from oslo_config import cfg

GROUP = cfg.OptGroup(
    "action_vault",
    title="Vault action",
    help="The ``vault`` revocation action (HashiCorp Vault or OpenBao).",
)

_OPTS: list[cfg.Opt] = [
    cfg.URIOpt("url", help="Base URL of Vault, e.g. https://vault.example.org:8200."),
    cfg.StrOpt(
        "token_file",
        help="File holding the Vault token the action uses. Its policy needs "
        "list+read on auth/token/accessors (sudo), update on "
        "auth/token/lookup-accessor, auth/token/revoke-accessor and "
        "sys/capabilities-accessor, list+read on <pki_mount>/certs and "
        "<pki_mount>/cert/*, update on <pki_mount>/revoke, list on "
        "<transit_mount>/keys, update on <transit_mount>/keys/*/rotate and "
        "<transit_mount>/keys/*/config, and sudo on "
        "sys/leases/revoke-prefix/* if lease_prefixes is set.",
    ),
    cfg.StrOpt("namespace", help="Vault namespace (Vault Enterprise / OpenBao)."),
    cfg.StrOpt(
        "ca_file",
        help="PEM CA bundle that signed Vault's server certificate "
        "(default: the system store).",
    ),
    cfg.StrOpt("cert_file", help="PEM client certificate for Vault (mTLS)."),
    cfg.StrOpt("key_file", help="PEM key of cert_file."),
    cfg.FloatOpt("timeout", default=10.0, min=0.1, help="Seconds per Vault request."),
    cfg.StrOpt(
        "node_metadata_key",
        default="node_uuid",
        help="Token metadata key naming the node a token was issued to: "
        "tokens whose metadata has this key equal to the revoked node's "
        "UUID are revoked (with their child tokens and leases).",
    ),
    cfg.StrOpt(
        "pki_mount",
        default="pki",
        help="Mount path of the PKI secrets engine that issues node "
        "certificates. Empty: skip certificate revocation.",
    ),
    cfg.StrOpt(
        "cert_common_name",
        default="{uuid}",
        help="Common name of a node's certificates; ``{uuid}`` is replaced "
        "by the node UUID. A certificate also belongs to the node when it "
        "has the URI SAN ``urn:uuid:<node uuid>``.",
    ),
    cfg.StrOpt(
        "transit_mount",
        default="transit",
        help="Mount path of the transit secrets engine. Empty: skip key rotation.",
    ),
    cfg.IntOpt(
        "keep_versions",
        default=0,
        min=0,
        help="After rotating a key the node could use, raise its "
        "min_decryption_version so that only the newest ``keep_versions`` "
        "versions decrypt. 0 leaves it unchanged (lazy revocation: old "
        "ciphertext stays readable by authorised clients and is rewrapped "
        "to the new version on access); 1 makes every pre-revocation "
        "ciphertext unreadable at once.",
    ),
    cfg.ListOpt(
        "lease_prefixes",
        default=[],
        help="Lease prefixes to revoke (``{uuid}`` replaced by the node "
        "UUID), e.g. ``database/creds/node-{uuid}``, for leases not "
        "owned by one of the node's tokens.",
    ),
    cfg.StrOpt(
        "state_file",
        help="JSON-lines file recording, per event, the transit keys the "
        "node could use (found before its tokens are revoked) and the keys "
        "already rotated, so a retried event neither forgets nor rotates "
        "a key twice. Unset: kept in memory.",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    """Register the ``[action_vault]`` options on ``conf``."""
    conf.register_group(cfg.OptGroup(GROUP.name, title=GROUP.title, help=GROUP.help))
    conf.register_opts(_OPTS, group=GROUP.name)


def list_opts() -> dict[cfg.OptGroup, list[cfg.Opt]]:
    """Return the options of this group for the config generator."""
    return {GROUP: _OPTS}
