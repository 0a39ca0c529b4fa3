"""``trusted-tenant events``: the signed events of the tenant's nodes
(revoked, failed, unreachable, recovered, policy changed), and whether
each was delivered to its consumers.
"""

from __future__ import annotations

import argparse
from typing import Any

from nova_plugin.commands.base import TenantCommand
from nova_plugin.tenant import Tenant
from verifier.protocol import MalformedError
from verifier.protocol.events import NODE_POLICY_CHANGED, PolicyChange

__all__ = ["Events"]


class Events(TenantCommand):
    name = "events"
    help = "show revocation events"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("uuid", nargs="?")

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
        return {"events": await tenant.events(args.uuid)}

    def lines(self, result: Any) -> list[str]:
        lines = []
        for item in result["events"]:
            event = item["signed_event"]["event"]
            kind = str(event.get("type", "node.revoked"))
            what = kind.removeprefix("node.")
            reason = str(event["reason"])
            if kind == NODE_POLICY_CHANGED:
                reason = f"{reason}, {_change(str(event.get('detail', '')))}"
            lines.append(
                f"{event['created_at']} node {event['node_uuid']} {what}: "
                f"{reason} (delivered: {item['delivered']})"
            )
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
