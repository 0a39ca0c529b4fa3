"""``trusted-nova-listener``: Nova's instance events to the verifier.

Runs on the provider's side next to the verifier: it reads the provider's
notification bus (``[oslo_messaging_notifications] transport_url``) and
calls the verifier with an operator certificate. It needs the
``messaging`` extra besides ``server``; without it, it says so in one line
and exits 2 (so oslo.messaging is imported only once that is checked).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterable
from typing import Any

import stevedore
from oslo_config import cfg
from oslo_log import log as logging

from verifier.common import config, extras, version
from verifier.common import tls as tlsutil
from verifier.common.plugins import InstanceHook
from verifier.conf import nova_listener as listener_conf
from verifier.exceptions import ConfigError

LOG = logging.getLogger(__name__)


def _missing_hooks(names: Iterable[str]) -> None:
    raise ConfigError(f"unknown [nova_listener] hooks: {sorted(names)}")


def _hook_failed(_manager: Any, entrypoint: Any, exc: BaseException) -> None:
    raise ConfigError(
        f"[nova_listener] hook {entrypoint.name}: {extras.explain(exc)}"
    ) from exc


def main(argv: list[str] | None = None) -> int:
    version.exit_if_asked(argv, "trusted-nova-listener")
    try:
        extras.require("messaging", "trusted-nova-listener")
    except extras.MissingExtraError as exc:
        print(f"trusted-nova-listener: {exc}", file=sys.stderr)
        return 2
    import oslo_messaging  # imported quietly by extras.require

    from verifier.nova_listener import InstanceEndpoint, VerifierOperator, make_listener

    conf = cfg.ConfigOpts()
    listener_conf.register_opts(conf)
    logging.register_options(conf)
    oslo_messaging.set_transport_defaults("nova")
    config.load(conf, argv, "trusted-nova-listener")
    config.setup_logging(conf, "trusted-nova-listener", "trusted-cloud")
    group = conf.nova_listener
    try:
        missing = [n for n in ("cert_file", "key_file", "ca_file") if not group[n]]
        if missing:
            raise ConfigError(f"missing options in [nova_listener]: {missing}")
        context = tlsutil.client_context(group.cert_file, group.key_file, group.ca_file)
        manager: stevedore.NamedExtensionManager[InstanceHook] = (
            stevedore.NamedExtensionManager(
                "verifier.instance_hooks",
                group.hooks,
                invoke_on_load=True,
                invoke_kwds={"conf": conf},
                on_missing_entrypoints_callback=_missing_hooks,
                on_load_failure_callback=_hook_failed,
            )
        )
        hooks = [ext.obj for ext in manager if ext.obj is not None]
        transport = oslo_messaging.get_notification_transport(conf)
    except (ConfigError, OSError, oslo_messaging.InvalidTransportURL) as exc:
        return config.fatal(conf, "trusted-nova-listener", exc, LOG)
    endpoint = InstanceEndpoint(
        VerifierOperator(group.verifier_url, context, group.timeout), hooks
    )
    listener = make_listener(
        transport, endpoint, group.topics, group.exchange, group.pool or None
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    listener.start()
    LOG.info("Listening for %s on exchange %s", group.topics, group.exchange)
    stop.wait()
    listener.stop()
    listener.wait()
    transport.cleanup()
    return 0
