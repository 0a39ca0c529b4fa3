"""``trusted-tenant events``: the signed events of the tenant's nodes
(revoked, failed, unreachable, recovered, policy changed), newest first,
filtered by node, time range, kind and reason (issue 30 item 3; options:
:mod:`nova_plugin.event_filters`), and whether each was delivered to its
consumers.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from nova_plugin.commands.base import TenantCommand
from nova_plugin.event_filters import add_event_options, event_query, event_row
from nova_plugin.exceptions import UsageError
from nova_plugin.tenant import Tenant
from verifier.protocol import MalformedError
from verifier.protocol.events import NODE_POLICY_CHANGED, PolicyChange

__all__ = ["Events"]


class Events(TenantCommand):
    name = "events"
    help = "show the signed events of your nodes (newest first)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "uuid", nargs="?", help="one node only (as --node; older form)"
        )
        add_event_options(parser)

    def check(self, args: argparse.Namespace) -> None:
        if args.uuid and args.node and args.uuid != args.node:
            raise UsageError("--node: give the node once (uuid or --node)")
        args.node = args.node or args.uuid
        args.query = event_query(args, time.time())

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
        return await tenant.list_events(args.query, args.all)

    def lines(self, result: Any) -> list[str]:
        lines = []
        for item in result["events"]:
            row = event_row(item)
            detail = str(row["detail"] or "")
            if row["kind"] == NODE_POLICY_CHANGED.removeprefix("node."):
                detail = _change(detail)
            lines.append(
                f"{row['created_at']}  {row['node_uuid']}  {row['kind']:<14}  "
                f"{row['reason']}: {detail[:200]} (delivered: {row['delivered']})"
            )
        if result.get("links"):
            lines.append("(more: --all, or --until the oldest time shown)")
        return lines


def _change(detail: str) -> str:
    """A policy change in words: ``runtime web@4 -> web@5``."""
    try:
        change = PolicyChange.from_detail(detail)
    except MalformedError:
        return detail[:200]

    def ref(policy: Any) -> str:
        return "none" if policy is None else f"{policy['name']}@{policy['version']}"

    return f"{change.kind} {ref(change.old)} -> {ref(change.new)}"
