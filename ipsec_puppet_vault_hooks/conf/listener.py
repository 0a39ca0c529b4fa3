"""Options of the ``[revocation_listener]`` group: the consumer service."""

from __future__ import annotations

from oslo_config import cfg, types

GROUP = cfg.OptGroup(
    "revocation_listener",
    title="Revocation listener",
    help="The ``trusted-revocation-listener`` service: where it receives "
    "signed revocation events from the verifier.",
)

_OPTS: list[cfg.Opt] = [
    cfg.ListOpt(
        "transports",
        default=["webhook"],
        item_type=types.String(choices=["webhook", "messaging"]),
        help="Where events come from: ``webhook`` (HTTPS endpoint, mTLS) "
        "and/or ``messaging`` (oslo.messaging notifications).",
    ),
    cfg.HostAddressOpt(
        "webhook_host", default="127.0.0.1", help="Address the webhook listens on."
    ),
    cfg.PortOpt("webhook_port", default=8895, help="Port of the webhook (HTTPS)."),
    cfg.StrOpt("cert_file", help="PEM server certificate of the webhook."),
    cfg.StrOpt("key_file", help="PEM private key of cert_file."),
    cfg.StrOpt(
        "ca_file",
        help="PEM CA bundle; the webhook requires a client certificate signed by it.",
    ),
    cfg.ListOpt(
        "webhook_clients",
        default=["verifier"],
        help="Client certificate common names allowed to POST events and "
        "read the counters.",
    ),
    cfg.StrOpt(
        "transport_url",
        secret=True,
        help="oslo.messaging transport URL of the broker (messaging "
        "transport). Default: [DEFAULT] transport_url.",
    ),
    cfg.FloatOpt(
        "redrive_interval",
        default=60.0,
        min=0.0,
        help="Seconds between tries of the dead-lettered actions (an "
        "action whose target was down longer than its retries); each is "
        "tried until it succeeds. 0: never (an operator replays them).",
    ),
    cfg.PortOpt(
        "metrics_port",
        default=0,
        help="Serve the listener's Prometheus metrics (hook action results "
        "and dead letters; no node or project is named in them) over plain "
        "HTTP on metrics_host:metrics_port, path /metrics. 0: off.",
    ),
    cfg.HostAddressOpt(
        "metrics_host",
        default="127.0.0.1",
        help="Address of the metrics listener: keep it on loopback (or a "
        "management network); it has no authentication.",
    ),
    cfg.StrOpt(
        "topic",
        default="trusted_revocation",
        help="Notification topic the verifier publishes to "
        "([notifier_messaging] topic); the listener consumes the durable "
        "queue ``<topic>.warn``.",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    """Register the ``[revocation_listener]`` options on ``conf``."""
    conf.register_group(cfg.OptGroup(GROUP.name, title=GROUP.title, help=GROUP.help))
    conf.register_opts(_OPTS, group=GROUP.name)


def list_opts() -> dict[cfg.OptGroup, list[cfg.Opt]]:
    """Return the options of this group for the config generator."""
    return {GROUP: _OPTS}
