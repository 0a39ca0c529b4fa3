"""Entry point for oslo-config-generator (namespace ``vtpm_manager``)."""

from oslo_config import cfg

from vtpm_manager.conf import instance_hook, vtpm


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return vtpm.list_opts() + instance_hook.list_opts()
