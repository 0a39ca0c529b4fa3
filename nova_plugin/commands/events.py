"""``trusted-tenant events``: the signed events of the tenant's nodes
(revoked, failed, unreachable, recovered), and whether each was delivered
to its consumers.
"""

from __future__ import annotations

import argparse
from typing import Any

from nova_plugin.commands.base import TenantCommand
from nova_plugin.tenant import Tenant

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
            what = str(event.get("type", "node.revoked")).removeprefix("node.")
            lines.append(
                f"{event['created_at']} node {event['node_uuid']} {what}: "
                f"{event['reason']} (delivered: {item['delivered']})"
            )
        return lines
