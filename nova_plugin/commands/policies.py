"""``trusted-tenant policy add|generate|list|show|delete``: the runtime
(IMA) and measured-boot policies stored at the verifier, which enrolments
name (``enrol --runtime-policy``, ``--mb-policy``), and ``generate``,
which builds one from a guest image offline (:mod:`nova_plugin.policygen`).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from nova_plugin.commands.base import (
    HANDLER,
    CommandGroup,
    LocalCommand,
    Subparsers,
    TenantCommand,
)
from nova_plugin.exceptions import UsageError
from nova_plugin.policygen import add_generate_parser, generate
from nova_plugin.tenant import Tenant
from verifier.protocol import MalformedError, jsonlimits

__all__ = [
    "PolicyAdd",
    "PolicyDelete",
    "PolicyGenerate",
    "PolicyGroup",
    "PolicyList",
    "PolicyShow",
]


def _add_ref(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ref", help="NAME, NAME@VERSION or digest")


class PolicyAdd(TenantCommand):
    name = "add"
    help = "store a policy file at the verifier"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("file", help="the policy (JSON)")
        parser.add_argument(
            "--name", help="the policy's name (required for measured-boot policies)"
        )
        parser.add_argument(
            "--signature", metavar="FILE", help="detached signature (raw bytes)"
        )

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
        try:
            with open(args.file, "rb") as f:
                document = jsonlimits.loads(f.read(), args.file, object_only=True)
        except OSError as exc:
            raise UsageError(f"{args.file}: {exc.strerror or exc}") from None
        except MalformedError as exc:
            raise UsageError(f"{args.file}: {exc.detail}") from None
        signature = None
        if args.signature:
            with open(args.signature, "rb") as f:
                signature = f.read()
        meta = await tenant.add_policy(args.kind, document, args.name, signature)
        return {
            "message": f"{args.kind} policy {meta['name']!r} version "
            f"{meta['version']} stored ({meta['entries']} entries, digest "
            f"{meta['digest'][:16]}...)"
        }


class PolicyGenerate(LocalCommand):
    name = "generate"
    help = "build a policy from a guest image (offline)"

    def add_to(self, subparsers: Subparsers) -> argparse.ArgumentParser:
        parser = add_generate_parser(subparsers)
        parser.set_defaults(**{HANDLER: self})
        return parser

    def run(self, args: argparse.Namespace) -> dict[str, Any]:
        return generate(args)


class PolicyList(TenantCommand):
    name = "list"
    help = "list stored policies"

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
        lines = [
            f"{r['name']}@{r['version']}  {r['entries']} entries  "
            f"{'signed' if r['signed'] else 'unsigned'}  {r['digest'][:16]}..."
            for r in await tenant.policies(args.kind)
        ]
        return {"message": "\n".join(lines) or f"no {args.kind} policies"}


class PolicyShow(TenantCommand):
    name = "show"
    help = "show one policy"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_ref(parser)

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
        policy = await tenant.policy(args.kind, args.ref)
        return {"message": json.dumps(policy, indent=2)}


class PolicyDelete(TenantCommand):
    name = "delete"
    help = "delete a policy no node uses"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_ref(parser)

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
        await tenant.delete_policy(args.kind, args.ref)
        return {"message": f"{args.kind} policy {args.ref!r} deleted"}


class PolicyGroup(CommandGroup):
    """``policy``: every subcommand takes ``--kind`` (last in its help)."""

    name = "policy"
    help = "store, list, show and delete runtime/measured-boot policies"
    dest = "policy_command"
    commands = (
        PolicyAdd(),
        PolicyGenerate(),
        PolicyList(),
        PolicyShow(),
        PolicyDelete(),
    )

    def add_common_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--kind",
            choices=("runtime", "measured-boot"),
            default="runtime",
            help="policy kind (default: runtime)",
        )
