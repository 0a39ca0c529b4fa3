"""Shared start-up of the aiohttp services: config, logging, mTLS, signals."""

from __future__ import annotations

import asyncio
import signal
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import uvloop
from aiohttp import web
from oslo_config import cfg
from oslo_log import log as logging

from verifier import conf as vconf
from verifier.common import config, conventions, cpuprofile, loop_errors, web_runner
from verifier.common import tls as tlsutil
from verifier.exceptions import ConfigError

LOG = logging.getLogger(__name__)


def setup(argv: list[str] | None, project: str) -> cfg.ConfigOpts:
    """Register options, parse the command line and set up oslo.log."""
    conf = cfg.ConfigOpts()
    vconf.register_opts(conf)
    logging.register_options(conf)
    config.load(conf, argv, project)  # one line and exit 2 on any error
    config.setup_logging(conf, project, "trusted-cloud")
    conventions.install_log_request_ids()
    return conf


def server_tls(
    group: cfg.ConfigOpts.GroupAttr, client_cert_optional: bool = False
) -> ssl.SSLContext:
    """The mTLS server context of ``group``'s ``cert_file``, ``key_file``
    and ``ca_file`` (see :func:`verifier.common.tls.server_context`).

    Raises:
        ConfigError: naming the option and the file that cannot be read or
            is not PEM.
    """
    name = group._group.name
    for opt in ("cert_file", "key_file", "ca_file"):
        path = getattr(group, opt)
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise ConfigError(f"[{name}] {opt} {path}: {exc.strerror or exc}")
    try:
        return tlsutil.server_context(
            group.cert_file,
            group.key_file,
            group.ca_file,
            client_cert_optional=client_cert_optional,
        )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"[{name}] cert_file {group.cert_file}, key_file {group.key_file}, "
            f"ca_file {group.ca_file}: not a usable certificate, key and CA "
            f"(PEM): {exc}"
        )


def require_options(group: cfg.ConfigOpts.GroupAttr, *names: str) -> None:
    """Raise ConfigError naming every missing option of ``group``."""
    missing = [n for n in names if not getattr(group, n)]
    if missing:
        raise ConfigError(f"missing options in [{group._group.name}]: {missing}")


async def serve(
    app: web.Application,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext,
    on_start: Callable[[], Awaitable[None]] | None = None,
    on_stop: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve ``app`` over TLS until SIGTERM or SIGINT.

    ``on_start`` runs before the port listens: a probe that finds the port
    open (DevStack's, systemd's, a load balancer's) finds everything
    started, the push endpoint included. If the port cannot be bound,
    ``on_stop`` undoes ``on_start`` before the error ends the service.
    """
    runner = web_runner.AppRunner(app)
    await runner.setup()
    if on_start is not None:
        await on_start()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    try:
        await site.start()
    except OSError:
        if on_stop is not None:
            await on_stop()
        await runner.cleanup()
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    LOG.info("Listening on https://%s:%d", host, port)
    await stop.wait()
    LOG.info("Stopping")
    if on_stop is not None:
        await on_stop()
    await runner.cleanup()


def run(
    main: Callable[[], Coroutine[Any, Any, None]],
    conf: cfg.ConfigOpts | None = None,
    prog: str = "trusted-cloud",
) -> int:
    """Run ``main`` (transport failures logged as one line each,
    :mod:`verifier.common.loop_errors`); an error that ends the service is
    one line on stderr, also logged when the log goes to a file, the
    journal or syslog (:func:`verifier.common.config.fatal`).

    Returns:
        0 when stopped by a signal, 2 on a configuration error, 1 when the
        service cannot start (a port in use, ...).
    """
    try:
        with cpuprofile.profiled(prog):  # opt-in, for benchmarks
            uvloop.run(loop_errors.guarded(main()))
    except ConfigError as exc:
        return config.fatal(conf, prog, exc, LOG)
    except (cfg.Error, ValueError) as exc:  # an option read after start
        return config.fatal(conf, prog, exc, LOG)
    except OSError as exc:
        config.fatal(conf, prog, exc, LOG, "cannot start")
        return 1
    return 0
