"""Options of policy-sealed data (group ``abe``): the verifier as
Excalibur's monitor issues CP-ABE keys to attested nodes."""

from oslo_config import cfg

GROUP = "abe"

_OPTS = [
    cfg.BoolOpt(
        "enabled",
        default=False,
        help="Issue CP-ABE keys to attested nodes and publish the public "
        "parameters at GET /v1/abe/params.",
    ),
    cfg.StrOpt(
        "master_key_file",
        default="/var/lib/trusted-cloud/abe-master.key",
        help="The CP-ABE master key (created 0600 if missing; refused if "
        "group or others may read it). Its public parameters are derived "
        "and published; the master key never leaves the verifier.",
    ),
    cfg.StrOpt(
        "provider_attributes_file",
        help="JSON file the operator maintains: node UUID -> provider-known "
        'attributes, e.g. {"<uuid>": {"host": "cn-12", "hv": '
        '"kvm-9", "region": "eu", "az": "eu-1a", "image": '
        '"sha256:ab12"}}. Re-read when it changes. A node without an '
        "entry gets no key.",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(_OPTS, group=GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(GROUP, _OPTS)]
