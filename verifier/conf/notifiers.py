"""Options of the ``webhook`` and ``messaging`` notifier drivers."""

from oslo_config import cfg

WEBHOOK_GROUP = "notifier_webhook"
MESSAGING_GROUP = "notifier_messaging"

_WEBHOOK_OPTS = [
    cfg.ListOpt(
        "urls",
        default=[],
        help="HTTPS URLs the signed revocation events are POSTed to (e.g. "
        "https://hooks.example.org:8895/v1/events). An event counts as "
        "acknowledged by this driver only when every URL answered 2xx.",
    ),
    cfg.StrOpt(
        "cert_file",
        help="PEM client certificate presented to the webhook endpoints "
        "(mTLS). Default: [verifier] cert_file.",
    ),
    cfg.StrOpt("key_file", help="PEM key of cert_file. Default: [verifier] key_file."),
    cfg.StrOpt(
        "ca_file",
        help="PEM CA bundle that signed the endpoints' server certificates. "
        "Default: [verifier] ca_file.",
    ),
    cfg.FloatOpt(
        "timeout",
        default=30.0,
        min=0.1,
        help="Seconds to wait for an endpoint's answer (it answers after its "
        "actions ran, so allow for their retries).",
    ),
]

_MESSAGING_OPTS = [
    cfg.StrOpt(
        "transport_url",
        secret=True,
        help="oslo.messaging transport URL of the broker (e.g. "
        "rabbit://user:password@host:5672/vhost). Default: [DEFAULT] "
        "transport_url.",
    ),
    cfg.StrOpt(
        "topic",
        default="trusted_revocation",
        help="Notification topic; events go to the queue "
        "``<topic>.warn`` on the control exchange.",
    ),
    cfg.IntOpt(
        "retry",
        default=0,
        min=0,
        help="Connection retries inside one publish; the outbox retries "
        "an unconfirmed event on its next passes anyway, so keep this low.",
    ),
    cfg.BoolOpt(
        "require_durable",
        default=True,
        help="Refuse to start unless [oslo_messaging_rabbit] "
        "amqp_durable_queues (or rabbit_quorum_queue) is set: a "
        "confirmed publish to a transient queue would be lost with a "
        "broker restart.",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(_WEBHOOK_OPTS, group=WEBHOOK_GROUP)
    conf.register_opts(_MESSAGING_OPTS, group=MESSAGING_GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(WEBHOOK_GROUP, _WEBHOOK_OPTS), (MESSAGING_GROUP, _MESSAGING_OPTS)]
