"""``trusted-tenant enrol``, ``status``, ``delete``, ``revoke`` and
``list``: a node's enrolment with a payload and a policy (the tenant's
side of the bootstrap, :meth:`nova_plugin.tenant.Tenant.enrol`) and its
attestation state at the verifier.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from nova_plugin.cliargs import attestation_mode
from nova_plugin.commands.base import (
    TenantCommand,
    add_pcr_options,
    read_pcr_policy,
    readable,
)
from nova_plugin.exceptions import UsageError
from nova_plugin.tenant import Tenant
from verifier.protocol import MalformedError
from verifier.protocol.attestation import AttestationMode
from verifier.protocol.messages.enrolment import check_interval

__all__ = ["Delete", "Enrol", "ListNodes", "Revoke", "Status", "describe"]

_STATES = {
    "pending": "enrolled at boot, Nova has not reported the instance created",
    "created": "instance created, waiting for its agent to register",
    "registered": "enrolled, waiting for its first integrity quote",
    "bootstrapping": "passed its first quote, receiving its key share",
    "attested": "trusted: its TPM quotes match the policy",
    "failed": "not trusted: a round of its attestation could not be completed",
    "unreachable": "not trusted: not answering the verifier (not revoked; a "
    "good quote brings it back)",
    "revoked": "REVOKED",
}


def describe(node: Mapping[str, Any]) -> str:
    """A node's view at the verifier in words (a line, and a line each
    for its IMA entries and its failure if any)."""
    words = _STATES.get(node["state"], node["state"])
    if node["state"] == "attested" and node.get("trusted") is False:
        words = "NOT TRUSTED NOW: attested, but its last good quote is stale"
    line = f"{node['uuid']}: {words} ({node['quotes_verified']} quotes verified)"
    if node.get("last_attested_at"):
        age = node.get("last_attested_age")
        ago = f", {age:g} s ago" if isinstance(age, int | float) else ""
        line += f"\n    last good quote: {node['last_attested_at']}{ago}"
    if node.get("ima_entries") is not None:
        line += f"\n    IMA entries verified: {node['ima_entries']}"
    if node.get("failure_reason"):
        line += f"\n    reason: {node['failure_reason']}"
    return line


def _interval(text: str) -> float:
    """``--interval``: a number of seconds the verifier can accept."""
    try:
        value = check_interval("--interval", float(text))
    except (ValueError, MalformedError) as exc:
        raise argparse.ArgumentTypeError(
            str(exc) if isinstance(exc, MalformedError) else f"not a number: {text!r}"
        ) from None
    assert value is not None
    return value


class Enrol(TenantCommand):
    name = "enrol"
    help = "enrol a node with a payload and a policy"
    needs_registrar = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("uuid", help="the node's UUID")
        parser.add_argument(
            "--payload",
            required=True,
            help="file to deliver; a script starting with #! is run",
        )
        add_pcr_options(parser, "of the node")
        parser.add_argument(
            "--runtime-policy",
            metavar="NAME",
            help="IMA runtime policy stored at the verifier ('trusted-tenant policy "
            "add'): NAME, NAME@VERSION or its digest; PCR 10 is then quoted and "
            "the IMA log replayed and judged on every quote",
        )
        parser.add_argument(
            "--mb-policy",
            metavar="NAME",
            help="measured-boot policy stored at the verifier; PCRs 0-9 are then "
            "quoted and the firmware event log replayed and judged once per boot",
        )
        parser.add_argument(
            "--mode",
            choices=tuple(AttestationMode),
            type=attestation_mode,
            default=AttestationMode.PULL,
            help="how the verifier attests the node: pull (default; it polls the "
            "agent) or push (the agent posts evidence to the verifier's push "
            "endpoint and opens no port: for nodes nobody can reach; the identity "
            "quote and U then go through the verifier's relay)",
        )
        parser.add_argument(
            "--interval",
            type=_interval,
            metavar="SECONDS",
            help="the node's own seconds between integrity quotes, its "
            "verification class (pull nodes; default: the verifier's "
            "quote_interval; the verifier may refuse intervals shorter than its "
            "min_node_interval)",
        )

    def check(self, args: argparse.Namespace) -> None:
        readable("--payload", args.payload)
        if args.interval is not None and args.mode is not AttestationMode.PULL:
            raise UsageError("--interval is for pull nodes (--mode pull)")

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
        with open(args.payload, "rb") as f:
            payload = f.read()
        stored = bool(args.runtime_policy or args.mb_policy)
        policy = read_pcr_policy(
            args,
            stored=stored,
            missing="give --pcr N=HEX, --policy FILE, --runtime-policy or --mb-policy",
        )
        result = await tenant.enrol(
            args.uuid,
            payload,
            policy,
            runtime_policy=args.runtime_policy,
            mb_policy=args.mb_policy,
            mode=args.mode,
            interval=args.interval,
        )
        return {
            "uuid": result.uuid,
            "state": result.state,
            "message": f"node {result.uuid} passed its identity quote; the "
            "verifier holds V and releases it after the first integrity "
            "quote; the node holds U and the sealed payload",
        }


class Status(TenantCommand):
    name = "status"
    help = "show a node's attestation state"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("uuid")

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
        return await tenant.status(args.uuid)

    def lines(self, result: Any) -> list[str]:
        return [describe(result)]


class Delete(TenantCommand):
    name = "delete"
    help = "stop attesting a node and forget it"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("uuid")

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
        await tenant.delete(args.uuid)
        return {"message": f"node {args.uuid} is no longer attested"}


class Revoke(TenantCommand):
    name = "revoke"
    help = "revoke a node now"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("uuid")
        parser.add_argument("--detail", default="revoked by the tenant")

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
        return await tenant.revoke(args.uuid, args.detail)

    def lines(self, result: Any) -> list[str]:
        return [describe(result)]


class ListNodes(TenantCommand):
    name = "list"
    help = "list enrolled nodes"

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
        return {"nodes": await tenant.nodes()}

    def lines(self, result: Any) -> list[str]:
        return [describe(node) for node in result["nodes"]]
