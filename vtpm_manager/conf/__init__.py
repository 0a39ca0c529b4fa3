"""Configuration of the vTPM manager."""

from oslo_config import cfg

from vtpm_manager.conf import vtpm

CONF = cfg.CONF


def register_opts(conf: cfg.ConfigOpts) -> None:
    vtpm.register_opts(conf)


__all__ = ["CONF", "register_opts"]
