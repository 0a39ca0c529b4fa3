"""Options of the ``[action_puppet]`` group: the ``puppet`` action."""

from __future__ import annotations

from oslo_config import cfg

GROUP = cfg.OptGroup(
    "action_puppet",
    title="Puppet action",
    help="The ``puppet`` revocation action: revoke the node's certificate "
    "through puppetserver's CA API and optionally deactivate the node in "
    "PuppetDB.",
)

_OPTS: list[cfg.Opt] = [
    cfg.URIOpt(
        "server_url",
        schemes=["https"],
        help="Base URL of the Puppet CA (puppetserver), e.g. "
        "https://puppet.example.org:8140.",
    ),
    cfg.StrOpt(
        "cert_file",
        help="Client certificate (PEM) presented to puppetserver and PuppetDB; "
        "signed by the Puppet CA and allowed by a rule in puppetserver's "
        "auth.conf for /puppet-ca/v1/certificate_status.",
    ),
    cfg.StrOpt("key_file", help="Private key (PEM) of ``cert_file``."),
    cfg.StrOpt(
        "ca_file",
        help="The Puppet CA certificate (PEM), to verify puppetserver and PuppetDB.",
    ),
    cfg.StrOpt(
        "certname_template",
        default="{uuid}",
        help="How a node's Puppet certname is made from its Nova instance "
        "UUID: must contain ``{uuid}`` exactly once, e.g. "
        "``{uuid}.nodes.example.org``.",
    ),
    cfg.FloatOpt(
        "timeout",
        default=10.0,
        min=0.1,
        help="Seconds allowed for connecting to and reading from puppetserver "
        "or PuppetDB.",
    ),
    cfg.URIOpt(
        "puppetdb_url",
        schemes=["https"],
        help="Base URL of PuppetDB, e.g. https://puppetdb.example.org:8081. "
        "When set, revoked nodes are also deactivated there (``deactivate "
        "node`` command); unset: PuppetDB is left alone.",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    """Register the ``[action_puppet]`` options on ``conf``."""
    # A fresh group per ConfigOpts (see action_log.register_opts).
    conf.register_group(cfg.OptGroup(GROUP.name, title=GROUP.title, help=GROUP.help))
    conf.register_opts(_OPTS, group=GROUP.name)


def list_opts() -> dict[cfg.OptGroup, list[cfg.Opt]]:
    """Return the options of this group for the config generator."""
    return {GROUP: _OPTS}
