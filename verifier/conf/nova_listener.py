"""Options of the Nova notification listener (group ``nova_listener``).

The bus itself is oslo.messaging's: ``[oslo_messaging_notifications]
transport_url`` (or ``[DEFAULT] transport_url``), as for Nova.
"""

from oslo_config import cfg

GROUP = "nova_listener"

_OPTS = [
    cfg.URIOpt(
        "verifier_url",
        default="https://127.0.0.1:8881",
        help="Base URL of the verifier API.",
    ),
    cfg.StrOpt(
        "cert_file",
        help="PEM client certificate whose common name is in the verifier's "
        "[verifier] operator_clients.",
    ),
    cfg.StrOpt("key_file", help="PEM private key of cert_file."),
    cfg.StrOpt("ca_file", help="PEM CA bundle that signed the verifier's certificate."),
    cfg.FloatOpt("timeout", default=10.0, min=0.1, help="Verifier request timeout."),
    cfg.ListOpt(
        "topics",
        default=["versioned_notifications"],
        help="Notification topics Nova emits versioned notifications on.",
    ),
    cfg.StrOpt("exchange", default="nova", help="Nova's control exchange."),
    cfg.StrOpt(
        "pool",
        default="trusted-cloud",
        help="Listener pool: a queue of our own, so other consumers of Nova's "
        "notifications (e.g. telemetry) still get every event.",
    ),
    cfg.ListOpt(
        "hooks",
        default=[],
        help="Extra instance lifecycle hooks (stevedore group "
        "verifier.instance_hooks): vtpm (drop a deleted instance's vTPM EK "
        "registration, options in [instance_hook_vtpm]), noop.",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(_OPTS, group=GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(GROUP, _OPTS)]
