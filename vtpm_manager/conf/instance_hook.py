"""Options of the listener's ``vtpm`` instance hook (group
``instance_hook_vtpm``, read by ``trusted-nova-listener``)."""

from oslo_config import cfg

GROUP = "instance_hook_vtpm"

_OPTS = [
    cfg.StrOpt(
        "registrar_url",
        default="https://127.0.0.1:8891",
        help="Base URL of the registrar (https: mTLS with cert_file).",
    ),
    cfg.StrOpt(
        "cert_file",
        help="PEM client certificate whose common name is in the registrar's "
        "[registrar]/provider_clients (or admin_clients).",
    ),
    cfg.StrOpt("key_file", help="PEM private key of cert_file."),
    cfg.StrOpt("ca_file", help="PEM CA bundle the registrar's certificate chains to."),
    cfg.IntOpt(
        "retries",
        default=2,
        min=0,
        help="Retries of the DELETE on transport errors or 5xx before the "
        "event is requeued.",
    ),
    cfg.FloatOpt(
        "backoff",
        default=0.5,
        min=0.0,
        help="First retry delay in seconds; it doubles on each retry.",
    ),
    cfg.FloatOpt(
        "timeout", default=10.0, min=0.1, help="Seconds per registrar request."
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(_OPTS, group=GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(GROUP, _OPTS)]
