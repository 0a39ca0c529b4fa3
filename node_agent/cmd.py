"""``trusted-agent``: run the node agent.

Starts the HTTPS API, registers the node with the registrar, activates the
AK, and serves until SIGTERM or SIGINT.

What goes wrong, and what the agent does (each logged as one line; in the
guest image the log also goes to the serial console, which Nova's console
log shows the tenant):

* configuration (no bootstrap file and no ``registrar_url``, a malformed
  bootstrap file, no usable node UUID, no CA): one line on stderr
  (``trusted-agent: configuration error: ...``, also in the log when it
  goes to a ``log_file``, the journal or syslog), exit status 2 at once, which
  the image's systemd unit does not restart; nothing will change by
  itself;
* registrar unreachable or answering 5xx, the TPM missing or failing
  (a vTPM that comes late), or the registrar refusing (it may be
  reconfigured, e.g. given the EK anchors, or a stale registration
  deleted): retried for as long as the agent runs (documented forever),
  with a backoff capped at :data:`BACKOFF_MAX` seconds; each failed attempt
  is logged with its number, its cause and when the next one comes;
* a TCTI that cannot be loaded (a typo in the module name before ``:`` or
  in its options): a configuration error, as above (:mod:`node_agent.tcti`);
  a TPM that does not answer yet is retried as the registrar is. tpm2-tss's
  own ``ERROR`` lines are kept off the terminal (``TSS2_LOG``);
* a payload that does not decrypt or unpack: the share that completed the
  pair is refused (the tenant or the verifier sees the code), nothing runs,
  and ``GET /v1/status`` keeps the reason (``last_error``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from aiohttp import web
from oslo_config import cfg
from oslo_log import log

from node_agent import conf as agent_conf
from node_agent import trial
from node_agent.agent import Agent
from node_agent.evidence import DEFAULT_IMA_LOG, EvidenceReader, default_ima_log
from node_agent.exceptions import (
    BootstrapError,
    NodeAgentError,
    RegistrationError,
    TpmError,
)
from node_agent.server import make_app
from node_agent.tcti import check_tcti, quiet_tss_log
from verifier.common import (
    config,
    conventions,
    extras,
    loop_errors,
    version,
    web_runner,
)
from verifier.common.errors import TctiConfigError
from verifier.protocol import MalformedError
from verifier.protocol.attestation import AttestationMode
from verifier.protocol.messages.abe import AbeKeyDelivery

LOG = logging.getLogger(__name__)
#: Seconds before the second attempt to register, and the most between
#: two attempts (each failed attempt is logged: a line at least this often).
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 60.0


def tpm_hint(tcti: str) -> str:
    """A reason a TPM device is missing, or '' if it is not a device TCTI
    or the device exists."""
    if not tcti.startswith("device:"):
        return ""
    path = tcti.partition(":")[2] or "/dev/tpmrm0"
    if os.path.exists(path):
        return ""
    return (
        f"no TPM device {path}: the instance has no vTPM (a flavor with "
        "hw:tpm_version=2.0?) or its driver is not loaded yet"
    )


def _reason(exc: Exception, hint: str) -> str:
    if isinstance(exc, TpmError):
        return f"TPM error: {hint or exc}"
    return str(exc)


async def register_with_retry(
    agent: Agent,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
    hint: Callable[[], str] = lambda: "",
) -> None:
    """Register and activate, retrying with a capped backoff until it works.

    Every failed attempt is logged (WARNING) with its number, its cause and
    when the next one comes: a line at least every :data:`BACKOFF_MAX`
    seconds for as long as the cause lasts.

    Args:
        agent: the agent.
        sleep: waits between attempts (tests pass a recorder).
        clock: seconds since some start, for the time the first attempt
            failed (logged with the later ones).
        hint: a clearer reason for TPM errors (e.g. no device), or ''.

    Raises:
        BootstrapError: the registrar or its CA is not configured, or the
            TCTI cannot be loaded (:class:`TctiConfigError`).
    """
    delay, attempt, first_failure = BACKOFF_FIRST, 0, 0.0
    while True:
        attempt += 1
        try:
            await agent.register()
            break
        except TctiConfigError as exc:
            raise BootstrapError(str(exc)) from exc
        except (RegistrationError, TpmError) as exc:
            reason = _reason(exc, hint())
        # Logged outside the except block: oslo.log would append the
        # exception a second time.
        if attempt == 1:
            first_failure = clock()
        LOG.warning(
            "registration of node %s failed (attempt %d, failing for %.0f s): "
            "%s; next attempt in %.0f s",
            agent.uuid,
            attempt,
            clock() - first_failure,
            reason,
            delay,
        )
        await sleep(delay)
        delay = min(delay * 2, BACKOFF_MAX)
    if attempt > 1:
        LOG.info("registration of node %s succeeded at attempt %d", agent.uuid, attempt)
    LOG.info("registered and activated AK for node %s", agent.uuid)


async def serve(
    agent: Agent,
    host: str,
    roles: Mapping[str, Collection[str]] | None = None,
    evidence: EvidenceReader | None = None,
    tcti: str = "",
    push_url: str | None = None,
) -> int:
    """Serve the API, register, and wait for SIGTERM/SIGINT; with
    ``push_url``, open no port at all and push evidence there once
    registered (:mod:`node_agent.push`): the tenant's identity quote and U
    come relayed by the verifier.

    Returns:
        The process exit code.

    Raises:
        BootstrapError: the registrar or the CA is not configured.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    runner = web_runner.AppRunner(make_app(agent, roles, evidence))
    await runner.setup()
    try:
        if push_url is None:
            await _listen(runner, agent, host)
        else:  # push mode: everything goes out to the verifier; no port
            LOG.info("node agent %s opens no port (push mode)", agent.uuid)
        registration = asyncio.create_task(
            register_with_retry(agent, hint=lambda: tpm_hint(tcti))
        )
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({registration, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if registration.done():
            registration.result()  # raises on failure
            if push_url is not None:
                await _push_until(
                    agent,
                    evidence or EvidenceReader(),
                    push_url,
                    stopper,
                    _abe_receiver(runner.app),
                )
            await stopper
        else:
            registration.cancel()
        LOG.info("node agent %s stopping", agent.uuid)
        return 0
    finally:
        await runner.cleanup()
        await agent.close()


async def _listen(runner: web.AppRunner, agent: Agent, host: str) -> None:
    """Serve the agent's API over HTTPS at ``host`` and ``agent.port``; a
    port 0 becomes the one the system picked.

    Raises:
        BootstrapError: ``ca_file`` is not set or cannot be read.
        OSError: the port cannot be bound.
    """
    site = web.TCPSite(runner, host, agent.port, ssl_context=agent.server_ssl_context())
    await site.start()
    if agent.port == 0:
        agent.port = int(runner.addresses[0][1])
    LOG.info("node agent %s listening on https://%s:%d", agent.uuid, host, agent.port)


async def _push_until(
    agent: Agent,
    evidence: EvidenceReader,
    push_url: str,
    stopper: asyncio.Task[Any],
    on_abe: Callable[[AbeKeyDelivery], None] | None = None,
) -> None:
    """Push evidence until stopped (or the node is revoked)."""
    from node_agent.push import run_push

    LOG.info("node agent %s pushes evidence to %s", agent.uuid, push_url)
    pushing = asyncio.create_task(run_push(agent, evidence, push_url, on_abe))
    await asyncio.wait({pushing, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if not pushing.done():
        pushing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pushing
    else:
        pushing.result()  # raises on failure


def _abe_receiver(
    app: web.Application,
) -> Callable[[AbeKeyDelivery], None] | None:
    """Where CP-ABE keys pushed with the verifier's answers go: the
    keyring of the agent's API (None without the ``abe`` extra)."""
    try:
        extras.require("abe", "CP-ABE keys in push mode")
    except extras.MissingExtraError:
        return None
    from node_agent.abe import keyring_of

    keyring = keyring_of(app)
    if keyring is None:
        return None
    return lambda d: keyring.receive(d.key, d.params, d.epoch)


def _describe(agent: Agent) -> None:
    """One line on what the agent starts with (never a secret)."""
    if agent.boot_payload is not None:
        payload = f"payload from the user-data (boot id {agent.boot_payload.boot_id})"
    else:
        payload = f"no payload in the user-data ({agent.no_payload_reason})"
    LOG.info(
        "node agent %s: registrar %s, CA %s, %s, %s",
        agent.uuid,
        agent.registrar_url,
        agent.ca_file,
        "client certificate " + agent.cert_file
        if agent.cert_file
        else "no client certificate (identity by the TPM)",
        payload,
    )


def _start(conf: cfg.ConfigOpts) -> Agent:
    """The agent, checked for what it needs before it can register.

    Raises:
        BootstrapError: not configured (see :func:`main`).
        MalformedError: ``uuid`` is not a UUID.
    """
    check_tcti(conf.agent.tcti)
    agent = Agent.from_conf(conf)
    if not agent.registrar_url:
        where = conf.agent.bootstrap_file or "no bootstrap file"
        raise BootstrapError(
            f"no registrar: [agent] registrar_url is unset and {where} does not "
            "exist (was this instance booted with 'trusted-nova boot'?)"
        )
    os.makedirs(agent.work_dir, mode=0o700, exist_ok=True)
    _describe(agent)
    return agent


def _evidence_paths(conf: cfg.ConfigOpts) -> tuple[str | None, str | None]:
    """The IMA list and the event log the agent sends (None: none); in
    trial mode those ``trusted-trial`` writes (:mod:`node_agent.trial`).

    Raises:
        BootstrapError: trial mode with a hardware TPM (exit status 2).
    """
    agent = conf.agent
    if not agent.trial_dir:
        ima = agent.ima_log_path
        if ima == DEFAULT_IMA_LOG:
            ima = default_ima_log()
        return ima or None, agent.mb_log_path or None
    try:
        ima, mb = trial.evidence_paths(agent.trial_dir, agent.tcti)
    except trial.TrialModeError as exc:
        raise BootstrapError(str(exc)) from None
    LOG.warning(
        "TRIAL MODE: the evidence sent is the files in %s written by "
        "trusted-trial, not this machine's kernel and firmware",
        agent.trial_dir,
    )
    return ima, mb


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``trusted-agent``.

    Returns:
        0 when stopped by a signal, 2 on a configuration error, 1 on any
        other failure.
    """
    version.exit_if_asked(argv, "trusted-agent")
    quiet_tss_log()
    conf = cfg.ConfigOpts()
    agent_conf.register_opts(conf)
    log.register_options(conf)
    try:  # one line and exit status 2 on a configuration error
        config.load(conf, argv, "trusted-agent")
        config.setup_logging(conf, "trusted-agent", "trusted-agent")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else config.EXIT_CONFIG
    conventions.install_log_request_ids()
    try:
        paths = _evidence_paths(conf)
        agent = _start(conf)
        # cloud-init writes the bootstrap file and its user-data copy without
        # syncing them: make them durable before the node registers, so that
        # a hard reset a moment later (a guest VM test's system_reset found
        # bootstrap.json empty after it) cannot leave the node unbootable.
        os.sync()
        roles = {
            "tenant": conf.agent.tenant_clients,
            "verifier": conf.agent.verifier_clients,
        }
        evidence = EvidenceReader(*paths, conf.agent.ima_max_bytes)
        push_url = None
        if conf.agent.attestation_mode == AttestationMode.PUSH:
            push_url = conf.agent.push_url or agent.bootstrap_push_url
            if not push_url:
                raise BootstrapError("[agent] attestation_mode = push needs push_url")
        elif agent.bootstrap_push_url:
            # the tenant enrolled this node in push mode (its user-data);
            # a push_url of agent.conf still wins
            push_url = conf.agent.push_url or agent.bootstrap_push_url
            LOG.info("the bootstrap file names a push endpoint: push mode")
        return asyncio.run(
            loop_errors.guarded(
                serve(
                    agent, conf.agent.host, roles, evidence, conf.agent.tcti, push_url
                )
            )
        )
    except (BootstrapError, MalformedError) as exc:
        # on stderr whatever the log's destination (log_file: the log too)
        return config.fatal(conf, "trusted-agent", exc, LOG)
    except (NodeAgentError, OSError) as exc:
        kind = "TPM error" if isinstance(exc, TpmError) else "error"
        config.fatal(conf, "trusted-agent", exc, LOG, kind)
        return 1


if __name__ == "__main__":
    sys.exit(main())
