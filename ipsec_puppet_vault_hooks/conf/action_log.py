"""Options of the ``[action_log]`` group: the ``log`` action."""

from __future__ import annotations

from oslo_config import cfg

GROUP = cfg.OptGroup(
    "action_log",
    title="Log action",
    help="The ``log`` revocation action.",
)

_OPTS: list[cfg.Opt] = [
    cfg.StrOpt(
        "record_file",
        help="If set, append one JSON line per revocation event to this file "
        "(each event is recorded once, even if delivered several times).",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    """Register the ``[action_log]`` options on ``conf``."""
    # A fresh group per ConfigOpts: register_group() shallow-copies the
    # group, so registering the shared GROUP would share its option state
    # (overrides included) between ConfigOpts instances.
    conf.register_group(cfg.OptGroup(GROUP.name, title=GROUP.title, help=GROUP.help))
    conf.register_opts(_OPTS, group=GROUP.name)


def list_opts() -> dict[cfg.OptGroup, list[cfg.Opt]]:
    """Return the options of this group for the config generator."""
    return {GROUP: _OPTS}
