"""Entry point for oslo-config-generator (namespace ``node_agent``)."""

from oslo_config import cfg

from node_agent.conf import agent


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return agent.list_opts()
