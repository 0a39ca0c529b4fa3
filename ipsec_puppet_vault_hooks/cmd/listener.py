"""``trusted-revocation-listener``: receive revocation events and act.

Verifies each signed event against ``[revocation_hooks]
verifier_public_key`` and runs ``[revocation_hooks] actions``; events come
from the HTTPS webhook and/or oslo.messaging (``[revocation_listener]
transports``; ``messaging`` needs the ``messaging`` extra). See
doc/source/user/revocation.rst.
"""

from __future__ import annotations

import asyncio
import logging as stdlib_logging
import os
import signal
import sys
import threading
from typing import Any

import uvloop
from aiohttp import web
from oslo_config import cfg
from oslo_log import log as logging

from ipsec_puppet_vault_hooks import conf as hooks_conf
from ipsec_puppet_vault_hooks.consumer import Consumer
from ipsec_puppet_vault_hooks.exceptions import HooksError
from ipsec_puppet_vault_hooks.listener import EventHandler, make_app
from verifier.common import config, extras, loop_errors, metrics, version, web_runner
from verifier.common import tls as tlsutil

LOG = logging.getLogger(__name__)
PROG = "trusted-revocation-listener"
STOP_TIMEOUT = 10.0
REDRIVEN_FILE = "redriven.jsonl"


async def _redrive_loop(handler: EventHandler, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            await asyncio.to_thread(handler.redrive)
        except Exception:  # keep the service up whatever an action does
            LOG.exception("Redrive pass failed")


def setup(argv: list[str] | None) -> cfg.ConfigOpts:
    """Register options, parse the command line and set up logging."""
    conf = cfg.ConfigOpts()
    hooks_conf.register_opts(conf)
    logging.register_options(conf)
    config.load(
        conf,
        argv,
        PROG,
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    config.setup_logging(conf, PROG, "trusted-cloud")
    return conf


def serve_metrics(group: cfg.ConfigOpts.GroupAttr) -> Any:
    """Start the metrics listener of ``[revocation_listener]`` on its own
    thread (None: ``metrics_port`` is 0). Returns its server."""
    if not group.metrics_port:
        return None
    from prometheus_client import start_http_server

    served = start_http_server(
        group.metrics_port, group.metrics_host, registry=metrics.REGISTRY
    )
    LOG.info("Metrics on http://%s:%d/metrics", group.metrics_host, group.metrics_port)
    return served[0] if isinstance(served, tuple) else served


async def serve(conf: cfg.ConfigOpts) -> None:
    """Run the configured transports until SIGTERM or SIGINT."""
    group = conf.revocation_listener
    state_dir = conf.revocation_hooks.state_dir
    handler = EventHandler(
        Consumer.from_conf(conf),
        os.path.join(state_dir, REDRIVEN_FILE) if state_dir else None,
    )
    server = None
    runner = None
    serve_metrics(group)
    if "messaging" in group.transports:
        try:
            extras.require("messaging", "[revocation_listener] transports = messaging")
        except extras.MissingExtraError as exc:
            raise HooksError(str(exc))
        from ipsec_puppet_vault_hooks.messaging import messaging_server

        server = messaging_server(conf, handler)
        server.start()
        LOG.info("Consuming notifications on topic %s", group.topic)
    if "webhook" in group.transports:
        missing = [n for n in ("cert_file", "key_file", "ca_file") if not group[n]]
        if missing:
            raise HooksError(f"[revocation_listener] webhook needs {missing}")
        ctx = tlsutil.server_context(group.cert_file, group.key_file, group.ca_file)
        runner = web_runner.AppRunner(make_app(handler, list(group.webhook_clients)))
        await runner.setup()
        site = web.TCPSite(
            runner, group.webhook_host, group.webhook_port, ssl_context=ctx
        )
        await site.start()
        LOG.info(
            "Webhook on https://%s:%d/v1/events", group.webhook_host, group.webhook_port
        )
    redrive = None
    if group.redrive_interval > 0:
        redrive = asyncio.create_task(_redrive_loop(handler, group.redrive_interval))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    LOG.info("Stopping")
    if redrive is not None:
        redrive.cancel()
    if runner is not None:
        await runner.cleanup()
    if server is not None:
        # Bounded: with the broker gone, stop() can wait for ever. Events
        # in flight are not acknowledged yet, so the broker redelivers them.
        stopper = threading.Thread(
            target=lambda: (server.stop(), server.wait()), daemon=True
        )
        stopper.start()
        await asyncio.to_thread(stopper.join, STOP_TIMEOUT)


def main(argv: list[str] | None = None) -> int:
    version.exit_if_asked(argv, PROG)
    conf = setup(argv)
    if not conf.revocation_listener.transports:
        return config.fatal(
            conf, PROG, "[revocation_listener] transports is empty", LOG
        )
    try:
        uvloop.run(loop_errors.guarded(serve(conf)))
    except HooksError as exc:
        return config.fatal(conf, PROG, exc, LOG)
    except OSError as exc:
        config.fatal(conf, PROG, exc, LOG, "cannot start")
        return 1
    # oslo.messaging's worker threads are not daemons and may still wait
    # on a dead broker: leave now (nothing unacknowledged is lost).
    stdlib_logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
