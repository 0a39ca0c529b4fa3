"""Per-project quotas of the verifier (group ``quota``).

Every project gets the same limits; ``-1`` is unlimited. The semantics
are those of Keystone's unified limits with the flat model (a project's
usage against one limit per resource); with ``source = keystone`` the
limits come from Keystone (oslo.limit, ``[oslo_limit]``), and these are
the defaults for resources Keystone has no registered limit for.
"""

from oslo_config import cfg

GROUP = "quota"

_OPTS: list[cfg.Opt] = [
    cfg.StrOpt(
        "source",
        default="config",
        choices=[
            ("config", "the limits below, the same for every project"),
            (
                "keystone",
                "Keystone unified limits via oslo.limit ([oslo_limit]); "
                "the limits below for resources without a registered limit",
            ),
        ],
        help="Where per-project limits come from.",
    ),
    cfg.IntOpt(
        "nodes",
        default=1000,
        min=-1,
        help="Nodes one project may have enrolled (any state, revoked "
        "included until deleted).",
    ),
    cfg.IntOpt(
        "pending_enrolments",
        default=100,
        min=-1,
        help="Nodes one project may have enrolled ahead of their instance "
        "(await_instance; states pending and created).",
    ),
    cfg.IntOpt(
        "policies",
        default=100,
        min=-1,
        help="Runtime and measured-boot policies (all versions) one project may store.",
    ),
    cfg.IntOpt(
        "policy_bytes",
        default=256 << 20,
        min=-1,
        help="Total bytes of canonical JSON of the policies one project may store.",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(_OPTS, group=GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(GROUP, _OPTS)]
