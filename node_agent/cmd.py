"""``trusted-agent``: run the node agent.

Starts the HTTPS API, registers the node with the registrar (retrying for
about a minute while the registrar is not reachable), activates the AK, and
serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Collection, Mapping

from aiohttp import web
from oslo_config import cfg
from oslo_log import log

from node_agent import conf as agent_conf
from node_agent.agent import Agent
from node_agent.evidence import EvidenceReader
from node_agent.exceptions import NodeAgentError, RegistrationError, TpmError
from node_agent.server import make_app
from verifier.protocol import MalformedError

LOG = logging.getLogger(__name__)
_REGISTER_DEADLINE = 60.0
_BACKOFF_FIRST, _BACKOFF_MAX = 1.0, 10.0


async def register_with_retry(
    agent: Agent, deadline: float = _REGISTER_DEADLINE
) -> None:
    """Register and activate, retrying with backoff while it may help.

    Raises:
        RegistrationError: refused, or still unreachable after ``deadline`` s.
        TpmError: the TPM failed.
    """
    give_up = time.monotonic() + deadline
    delay, attempt = _BACKOFF_FIRST, 0
    while True:
        attempt += 1
        try:
            await agent.register()
            break
        except RegistrationError as exc:
            failure = exc
        # Logged outside the except block: oslo.log would append the
        # exception a second time.
        left = give_up - time.monotonic()
        if not failure.retryable or left <= 0:
            raise failure
        wait = min(delay, left)
        LOG.warning(
            "registration attempt %d failed (%s); retrying in %.0f s",
            attempt,
            failure,
            wait,
        )
        await asyncio.sleep(wait)
        delay = min(delay * 2, _BACKOFF_MAX)
    LOG.info("registered and activated AK for node %s", agent.uuid)


async def serve(
    agent: Agent,
    host: str,
    roles: Mapping[str, Collection[str]] | None = None,
    evidence: EvidenceReader | None = None,
) -> int:
    """Serve the API, register, and wait for SIGTERM/SIGINT.

    Returns:
        The process exit code.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    runner = web.AppRunner(make_app(agent, roles, evidence), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(
            runner, host, agent.port, ssl_context=agent.server_ssl_context()
        )
        await site.start()
        if agent.port == 0:
            agent.port = int(runner.addresses[0][1])
        LOG.info(
            "node agent %s listening on https://%s:%d", agent.uuid, host, agent.port
        )
        registration = asyncio.create_task(register_with_retry(agent))
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({registration, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if registration.done():
            registration.result()  # raises on failure
            await stopper
        else:
            registration.cancel()
        LOG.info("node agent %s stopping", agent.uuid)
        return 0
    finally:
        await runner.cleanup()
        await agent.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``trusted-agent``."""
    conf = cfg.ConfigOpts()
    agent_conf.register_opts(conf)
    log.register_options(conf)
    conf(
        sys.argv[1:] if argv is None else argv,
        project="trusted-cloud",
        prog="trusted-agent",
    )
    log.setup(conf, "trusted-agent")
    try:
        agent = Agent.from_conf(conf)
        os.makedirs(agent.work_dir, mode=0o700, exist_ok=True)
        # cloud-init writes the bootstrap file and its user-data copy without
        # syncing them: make them durable before the node registers, so that
        # a hard reset a moment later (a guest VM test's system_reset found
        # bootstrap.json empty after it) cannot leave the node unbootable.
        os.sync()
        roles = {
            "tenant": conf.agent.tenant_clients,
            "verifier": conf.agent.verifier_clients,
        }
        evidence = EvidenceReader(
            conf.agent.ima_log_path or None,
            conf.agent.mb_log_path or None,
            conf.agent.ima_max_bytes,
        )
        return asyncio.run(serve(agent, conf.agent.host, roles, evidence))
    except (NodeAgentError, MalformedError, OSError) as exc:
        kind = "TPM error" if isinstance(exc, TpmError) else "error"
        LOG.error("node agent failed: %s: %s", kind, exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
