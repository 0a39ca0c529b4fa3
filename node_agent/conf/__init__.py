"""Configuration of the node agent."""

from oslo_config import cfg

from node_agent.conf import agent

CONF = cfg.CONF


def register_opts(conf: cfg.ConfigOpts) -> None:
    agent.register_opts(conf)


__all__ = ["CONF", "register_opts"]
