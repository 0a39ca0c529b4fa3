"""Options of the ``[action_ipsec]`` group: the ``ipsec`` action."""

from __future__ import annotations

from oslo_config import cfg

GROUP = cfg.OptGroup(
    "action_ipsec",
    title="IPsec action",
    help="The ``ipsec`` revocation action: revokes a node's IPsec "
    "certificate on a CRL and drops its connection from a strongSwan "
    "charon through the vici socket.",
)

_OPTS: list[cfg.Opt] = [
    cfg.StrOpt(
        "vici_socket",
        default="/var/run/charon.vici",
        help="Path of charon's vici UNIX socket.",
    ),
    cfg.FloatOpt(
        "vici_timeout",
        default=30.0,
        min=1.0,
        help="Seconds to wait for one answer from charon. Must exceed "
        "``terminate_timeout``.",
    ),
    cfg.IntOpt(
        "terminate_timeout",
        default=5000,
        min=0,
        help="Milliseconds charon waits for the revoked peer to acknowledge "
        "the deletion of its IKE SA before it drops the SA anyway.",
    ),
    cfg.StrOpt(
        "peers_dir",
        help="Directory of peer mappings written by provisioning: one "
        "``<node_uuid>.json`` file per IPsec peer, naming its connection, "
        "its certificate and (optionally) its swanctl connection settings. "
        "Required.",
    ),
    cfg.StrOpt(
        "ca_cert",
        help="PEM certificate of the CA that issued the peers' "
        "certificates; the CRL is issued in its name. Required.",
    ),
    cfg.StrOpt(
        "ca_key",
        help="PEM private key of that CA (ECDSA, RSA or Ed25519), used to "
        "sign the CRL. Required; keep it readable by this service only.",
    ),
    cfg.StrOpt(
        "crl_file",
        help="Where the CRL is kept (PEM). The action adds each revoked "
        "serial to it, so it is also the record of what was revoked. Put "
        "it in ``/etc/swanctl/x509crl/`` so that ``swanctl --load-creds`` "
        "loads it after a charon restart. Required.",
    ),
    cfg.IntOpt(
        "crl_lifetime",
        default=30,
        min=1,
        help="Days between the CRL's thisUpdate and nextUpdate. strongSwan "
        "still honours a revoked entry in a stale CRL.",
    ),
    cfg.StrOpt(
        "swanctl_conf",
        help="If set, after each revocation the connections of every peer "
        "in ``peers_dir`` that is not revoked are written to this file in "
        "swanctl.conf syntax (e.g. ``/etc/swanctl/conf.d/trusted-peers."
        "conf``), so that ``swanctl --load-conns`` never brings a revoked "
        "peer back.",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    """Register the ``[action_ipsec]`` options on ``conf``."""
    # A fresh group per ConfigOpts: register_group() shallow-copies the
    # group, so registering the shared GROUP would share its option state
    # (overrides included) between ConfigOpts instances.
    conf.register_group(cfg.OptGroup(GROUP.name, title=GROUP.title, help=GROUP.help))
    conf.register_opts(_OPTS, group=GROUP.name)


def list_opts() -> dict[cfg.OptGroup, list[cfg.Opt]]:
    """Return the options of this group for the config generator."""
    return {GROUP: _OPTS}
