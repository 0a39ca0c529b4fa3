"""Options of the ``[puppet_autosign]`` group: ``trusted-puppet-autosign``."""

from __future__ import annotations

from oslo_config import cfg

GROUP = cfg.OptGroup(
    "puppet_autosign",
    title="Puppet autosign",
    help="The ``trusted-puppet-autosign`` policy executable: Puppet signs a "
    "node's certificate request only when the verifier reports that node "
    "attested.",
)

_OPTS: list[cfg.Opt] = [
    cfg.URIOpt(
        "verifier_url",
        schemes=["https"],
        help="Base URL of the verifier API, e.g. https://verifier:8881.",
    ),
    cfg.StrOpt(
        "cert_file",
        help="Client certificate (PEM) for the verifier; its common name must "
        "hold the verifier's ``tenant`` role.",
    ),
    cfg.StrOpt("key_file", help="Private key (PEM) of ``cert_file``."),
    cfg.StrOpt("ca_file", help="CA certificate (PEM) that signed the verifier's."),
    cfg.StrOpt(
        "certname_template",
        default="{uuid}",
        help="How a node's Puppet certname is made from its Nova instance "
        "UUID (see ``[action_puppet] certname_template``); certnames that do "
        "not match are refused.",
    ),
    cfg.ListOpt(
        "accepted_states",
        default=["attested"],
        help="Verifier node states for which a request is signed.",
    ),
    cfg.BoolOpt(
        "require_pp_uuid",
        default=False,
        help="Also require the request to carry Puppet's ``pp_uuid`` extension "
        "(OID 1.3.6.1.4.1.34380.1.1.1, set through the agent's "
        "csr_attributes.yaml) equal to the node UUID.",
    ),
    cfg.StrOpt(
        "challenge_password",
        secret=True,
        help="If set, also require the request's challengePassword attribute "
        "(csr_attributes.yaml ``custom_attributes``) to equal this value.",
    ),
    cfg.FloatOpt(
        "timeout",
        default=10.0,
        min=0.1,
        help="Seconds allowed for the verifier to answer.",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    """Register the ``[puppet_autosign]`` options on ``conf``."""
    # A fresh group per ConfigOpts (see action_log.register_opts).
    conf.register_group(cfg.OptGroup(GROUP.name, title=GROUP.title, help=GROUP.help))
    conf.register_opts(_OPTS, group=GROUP.name)


def list_opts() -> dict[cfg.OptGroup, list[cfg.Opt]]:
    """Return the options of this group for the config generator."""
    return {GROUP: _OPTS}
