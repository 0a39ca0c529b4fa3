"""``trusted-tenant enrol``, ``status``, ``delete``, ``revoke``, ``list``
and ``node set-policy``: a node's enrolment with a payload and a policy
(the tenant's side of the bootstrap,
:meth:`nova_plugin.tenant.Tenant.enrol`), its attestation state at the
verifier, and the policies in force on it.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from nova_plugin.cliargs import attestation_mode
from nova_plugin.commands.base import (
    CommandGroup,
    TenantCommand,
    add_pcr_options,
    read_pcr_policy,
    readable,
)
from nova_plugin.exceptions import UsageError
from nova_plugin.tenant import Tenant
from verifier.protocol import MalformedError, canonical_uuid
from verifier.protocol.attestation import AttestationMode
from verifier.protocol.messages.enrolment import (
    MAX_POLICY_REF,
    PolicyChangeRequest,
    check_interval,
)

__all__ = [
    "Delete",
    "Enrol",
    "ListNodes",
    "NodeGroup",
    "Revoke",
    "SetPolicy",
    "Status",
    "describe",
    "in_force",
]

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
    "host_untrusted": "HOST UNTRUSTED: its compute host was found untrusted; "
    "treat the node as compromised (move it and enrol it again)",
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
    for kind, policy in in_force(node).items():
        line += f"\n    {kind} policy: {policy}"
    if node.get("ima_entries") is not None:
        line += f"\n    IMA entries verified: {node['ima_entries']}"
    host = node.get("host")
    if isinstance(host, Mapping):
        line += f"\n    compute host: {host.get('name')}, {_host_words(host)}"
    if node.get("failure_reason"):
        line += f"\n    reason: {node['failure_reason']}"
    return line


def _host_words(host: Mapping[str, Any]) -> str:
    """A compute host's verdict in words (``trusted`` true, false or null)."""
    trusted = host.get("trusted")
    words = "not known now"
    if trusted is True:
        words = "trusted"
    elif trusted is False:
        words = "UNTRUSTED"
    return f"{words} as of {host.get('as_of')}" if host.get("as_of") else words


def in_force(node: Mapping[str, Any]) -> dict[str, str]:
    """Per kind, the policy in force on ``node`` in words: ``web@5
    (follows web)`` or ``web@4 (pinned)`` (kinds without one left out)."""
    out = {}
    policies = node.get("policies")
    for kind, policy in (policies if isinstance(policies, Mapping) else {}).items():
        if not isinstance(policy, Mapping):
            continue
        name, version = policy.get("name"), policy.get("version")
        what = f"{name}@{version}" if name is not None else str(policy.get("digest"))
        how = f"follows {name}" if policy.get("follows") else "pinned"
        out[str(kind)] = f"{what} ({how})"
    return out


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
            "add'): NAME follows it (its newest version is in force, now and "
            "whenever a newer one is added), NAME@VERSION or its digest pins one; "
            "PCR 10 is then quoted and the IMA log replayed and judged on every "
            "quote",
        )
        parser.add_argument(
            "--mb-policy",
            metavar="NAME",
            help="measured-boot policy stored at the verifier (NAME follows it, "
            "NAME@VERSION or its digest pins one); PCRs 0-9 are then quoted and "
            "the firmware event log replayed and judged once per boot",
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
            "verification class: how often the verifier polls a pull node, or "
            "tells a push node's agent to post (default: the verifier's "
            "quote_interval; the verifier may refuse intervals shorter than its "
            "min_node_interval)",
        )

    def check(self, args: argparse.Namespace) -> None:
        readable("--payload", args.payload)

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


class SetPolicy(TenantCommand):
    name = "set-policy"
    help = "change the runtime or measured-boot policy in force on a node"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("uuid", help="the node's UUID")
        for kind, option in (("runtime", "runtime"), ("measured-boot", "mb")):
            group = parser.add_mutually_exclusive_group()
            group.add_argument(
                f"--{option}-policy",
                metavar="REF",
                help=f"the {kind} policy stored at the verifier: NAME follows it "
                "(its newest version is in force, now and whenever a newer one is "
                "added), NAME@VERSION or a digest pins that one; judged from the "
                "node's next quote on, its IMA replay goes on",
            )
            group.add_argument(
                f"--no-{option}-policy",
                action="store_true",
                help=f"no {kind} policy from now on",
            )

    def changes(self, args: argparse.Namespace) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for option in ("runtime", "mb"):
            ref = getattr(args, f"{option}_policy")
            if getattr(args, f"no_{option}_policy"):
                out[f"{option}_policy"] = None
            elif ref is not None:
                out[f"{option}_policy"] = ref
        return out

    def check(self, args: argparse.Namespace) -> None:
        changes = self.changes(args)
        if not changes:
            raise UsageError(
                "give --runtime-policy, --mb-policy, --no-runtime-policy or "
                "--no-mb-policy"
            )
        try:
            canonical_uuid(args.uuid)
            PolicyChangeRequest(changes)
        except MalformedError as exc:
            raise UsageError(str(exc)) from None
        for ref in changes.values():
            if ref is not None and not 0 < len(ref) <= MAX_POLICY_REF:
                raise UsageError(
                    f"a policy reference has 1-{MAX_POLICY_REF} characters"
                )

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
        return await tenant.set_policy(args.uuid, self.changes(args))

    def lines(self, result: Any) -> list[str]:
        return [describe(result)]


class NodeGroup(CommandGroup):
    """``node``: commands on an enrolled node."""

    name = "node"
    help = "change an enrolled node (its policies in force)"
    dest = "node_command"
    commands = (SetPolicy(),)
