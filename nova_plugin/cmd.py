"""``trusted-tenant``: enrol nodes, watch them, revoke them; check the
verifier's own integrity (``monitor-trust``, ``monitor-attest``); seal a
payload to a policy over attested node attributes (``seal --seal-policy``,
``send-sealed``).

Connection settings come from options or the environment
(``TRUSTED_REGISTRAR_URL``, ``TRUSTED_VERIFIER_URL``, ``TRUSTED_CA``).
With keystoneauth options (``--os-auth-type`` or ``OS_AUTH_TYPE``, and
the usual ``OS_*``) every call goes over the user's Keystone session and
no tenant certificate is needed; without them (the ``noauth`` demo)
``TRUSTED_CERT`` and ``TRUSTED_KEY`` name the tenant's project. Nodes'
agents are reached through the verifier's relay in both cases
(``--direct-agents`` keeps the older direct path to polled agents).

``seal`` needs the ``abe`` extra (``pip install 'trusted-cloud[abe]'``);
without it the command says so in one line and exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from keystoneauth1 import exceptions as ks_exc
from keystoneauth1 import loading as ks_loading

from nova_plugin.cliargs import SETTINGS_ENV, certificate_tenant, missing_settings
from nova_plugin.commands import events, history, integrity, nodes, policies, sealing
from nova_plugin.commands.base import (
    HANDLER,
    Command,
    CommandGroup,
    LocalCommand,
    TenantCommand,
    readable,
)
from nova_plugin.exceptions import TenantError, UsageError
from nova_plugin.tenant import Tenant
from nova_plugin.tenant_auth import keystone_tenant
from verifier.common import extras, version
from verifier.protocol import MalformedError

__all__ = ["COMMANDS", "main", "parser"]

#: The subcommands, in the order the help lists them.
COMMANDS: tuple[Command | CommandGroup, ...] = (
    nodes.Enrol(),
    policies.PolicyGroup(),
    nodes.Status(),
    nodes.Delete(),
    nodes.Revoke(),
    nodes.ListNodes(),
    nodes.NodeGroup(),
    sealing.Seal(),
    sealing.SendSealed(),
    integrity.MonitorTrust(),
    integrity.MonitorAttest(),
    events.Events(),
    history.History(),
    history.Checkpoint(),
)


def parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The command line: the connection settings, keystoneauth's options
    (those of the auth type ``argv`` names) and each command's own."""
    p = argparse.ArgumentParser(
        prog="trusted-tenant",
        description="Enrol nodes with an encrypted payload, check their "
        "attestation status, and revoke them; seal payloads to a policy over "
        "attested node attributes; check the verifier's own integrity.",
    )
    for name, env in SETTINGS_ENV.items():
        p.add_argument(
            f"--{name}", default=os.environ.get(env), help=f"(default: ${env})"
        )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--direct-agents",
        action="store_true",
        help="reach polled nodes' agents directly with --cert/--key (which "
        "the agents must accept) instead of through the verifier's relay",
    )
    ks_loading.register_session_argparse_arguments(p)
    ks_loading.register_auth_argparse_arguments(
        p, list(argv if argv is not None else sys.argv[1:]), default=None
    )
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_to(sub)
    return p


def _tenant(args: argparse.Namespace, command: TenantCommand) -> Tenant:
    """The tenant client: on a Keystone session when keystoneauth options
    are given (no certificate), else with the ``noauth`` demo's tenant
    certificate.

    Raises:
        UsageError: a missing setting, an unreadable file, or the
            command's own input refused (:meth:`TenantCommand.check`).
    """
    direct = args.direct_agents or command.agent_api
    auth = ks_loading.load_auth_from_argparse_arguments(args)
    needed = ["registrar"] if command.needs_registrar else []
    if auth is None or direct:  # certificates (the noauth demo, or agents)
        needed += ["verifier", "cert", "key", "ca"]
    missing = [n for n in needed if not getattr(args, n)]
    if missing:
        raise missing_settings(missing)
    for name in ("cert", "key", "ca"):
        if getattr(args, name):
            readable(f"--{name} (or ${SETTINGS_ENV[name]})", getattr(args, name))
    command.check(args)
    if auth is not None and not direct:
        session = ks_loading.load_session_from_argparse_arguments(args, auth=auth)
        return keystone_tenant(
            session,
            (args.registrar or "").rstrip("/"),
            (args.verifier or "").rstrip("/") or None,
            args.ca,
        )
    return certificate_tenant(args, direct)


async def _run(command: TenantCommand, args: argparse.Namespace) -> Any:
    tenant = _tenant(args, command)
    try:
        return await command.run(tenant, args)
    finally:
        await tenant.close()


def _print(command: Command, result: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return
    for line in command.lines(result):
        print(line)


def _error(message: object, status: int) -> int:
    print(f"trusted-tenant: error: {message}", file=sys.stderr)
    return status


def main(argv: list[str] | None = None) -> int:
    """``trusted-tenant``; the exit status (2: bad input, 1: refused or
    failed, or the command's own, e.g. ``policy check``'s 1 when a node
    would fail)."""
    version.exit_if_asked(argv, "trusted-tenant")
    args = parser(argv).parse_args(argv)
    command = getattr(args, HANDLER).resolve(args)
    if isinstance(command, LocalCommand):
        try:  # offline: no verifier, no credentials
            result = command.run(args)
            _print(command, result, args.json)
        except UsageError as exc:  # e.g. a package that does not verify
            return _error(exc, 2)
        except (TenantError, OSError) as exc:
            return _error(exc, 1)
        return command.exit_status(result)
    assert isinstance(command, TenantCommand)
    if command.extra:
        try:
            extras.require(command.extra, f"trusted-tenant {command.name}")
        except extras.MissingExtraError as exc:
            return _error(exc, 2)
    try:
        result = asyncio.run(_run(command, args))
        _print(command, result, args.json)
    except UsageError as exc:
        return _error(exc, 2)
    except (TenantError, MalformedError, OSError) as exc:
        return _error(exc, 1)
    except ks_exc.ClientException as exc:  # e.g. Keystone unreachable
        return _error(f"Keystone: {exc}", 1)
    return command.exit_status(result)
