"""Options of the ``[revocation_hooks]`` group: the event consumer."""

from __future__ import annotations

from oslo_config import cfg

GROUP = cfg.OptGroup(
    "revocation_hooks",
    title="Revocation hooks",
    help="How signed revocation events from the verifier are consumed.",
)

_OPTS: list[cfg.Opt] = [
    cfg.ListOpt(
        "actions",
        default=["log"],
        help="Names of the actions (entry points of the "
        "``ipsec_puppet_vault_hooks.actions`` group) run for every verified "
        "revocation event, in order.",
    ),
    cfg.ListOpt(
        "failed_actions",
        help="Names of the actions run for a verified ``node.failed`` event "
        "(a round of the node's attestation broke: the verifier cannot vouch "
        "for it and keeps polling it). Unset: the same as ``actions`` -- "
        "fail closed, the node is cut off like a revoked one. Set it to "
        "``log`` to only record such events.",
    ),
    cfg.ListOpt(
        "host_untrusted_actions",
        help="Names of the actions run for a verified ``node.host_untrusted`` "
        "event: the compute host running the node was found untrusted "
        "(trusted compute pools). A compromised host could read the guest's "
        "vTPM state and memory, so the guest is treated as compromised. "
        "Unset: the same as ``actions`` (revocation).",
    ),
    cfg.ListOpt(
        "unreachable_actions",
        default=["log"],
        help="Names of the actions run for a verified ``node.unreachable`` "
        "event: the node stopped answering (an agent restart, a reboot, a "
        "network cut). Nothing is known against it and it is still polled: "
        "a good quote brings it back (``node.recovered``), and a node still "
        "silent after the verifier's ``unreachable_timeout`` is revoked, "
        "which runs ``actions``. Default: only log it.",
    ),
    cfg.ListOpt(
        "recovered_actions",
        default=["log"],
        help="Names of the actions run for a verified ``node.recovered`` "
        "event (a failed or unreachable node passed a quote again).",
    ),
    cfg.StrOpt(
        "verifier_public_key",
        help="Path to the verifier's Ed25519 public key (PEM). Events not "
        "signed by this key are rejected.",
    ),
    cfg.IntOpt(
        "max_attempts",
        default=3,
        min=1,
        help="How many times an action is tried on one event before the "
        "event is dead-lettered for that action.",
    ),
    cfg.FloatOpt(
        "retry_delay",
        default=0.5,
        min=0.0,
        help="Seconds to wait before the first retry of a failed action; "
        "doubled before each further retry.",
    ),
    cfg.StrOpt(
        "state_dir",
        help="Directory holding the processed-events and dead-letter files, "
        "so a restarted consumer remembers what it handled. Unset: state is "
        "kept in memory only.",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    """Register the ``[revocation_hooks]`` options on ``conf``."""
    # A fresh group per ConfigOpts: register_group() shallow-copies the
    # group, so registering the shared GROUP would share its option state
    # (overrides included) between ConfigOpts instances.
    conf.register_group(cfg.OptGroup(GROUP.name, title=GROUP.title, help=GROUP.help))
    conf.register_opts(_OPTS, group=GROUP.name)


def list_opts() -> dict[cfg.OptGroup, list[cfg.Opt]]:
    """Return the options of this group for the config generator."""
    return {GROUP: _OPTS}
