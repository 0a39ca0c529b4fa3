"""``openstack attestation host evacuate NAME [--dry-run] [--wait]``.

Moves every guest off a compute host through Nova's API with the
``openstack`` client's own keystoneauth session (an admin's: it lists
every project's guests on the host and migrates them); the work is
:class:`~nova_plugin.evacuate.Evacuation`. One line per guest (moved to
X, would move, requested, or could not: Nova's reason); exit status 1 if
any guest could not be moved, 2 (one line) for a host Nova does not know.
The host is named by Nova's host name or by its compute node's UUID (its
Placement resource provider, as ``host enrol --provider`` takes it).
"""

from __future__ import annotations

import argparse
from typing import TextIO

from osc_lib.command import command

from nova_plugin.evacuate import ComputeApi, Evacuation
from nova_plugin.exceptions import TenantError, UsageError


class EvacuateHost(command.Command):
    """Move every guest off a compute host (live migration where its vTPM
    allows it, hw:tpm_secret_security=host; cold migration otherwise)."""

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument(
            "host",
            metavar="<host>",
            help="the compute host: Nova's host name, or its compute node's "
            "(resource provider's) UUID",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="only say how each guest would be moved",
        )
        parser.add_argument(
            "--wait",
            action="store_true",
            help="wait for each move to end (and confirm cold migrations)",
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=600.0,
            metavar="<seconds>",
            help="how long one guest's move is waited for (default 600)",
        )
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> int:
        manager = self.app.client_manager
        api = ComputeApi(
            manager.session,
            interface=manager.interface,
            region_name=manager.region_name,
        )
        return run(api, parsed_args, self.app.stdout, self.app.stderr)


def run(
    api: ComputeApi,
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
) -> int:
    """Evacuate ``args.host``; the exit status."""
    if not args.host.strip() or args.timeout <= 0:
        print("give a host name and a positive --timeout", file=err)
        return 2
    try:
        outcomes = Evacuation(api, timeout=args.timeout).run(
            args.host, dry_run=args.dry_run, wait=args.wait
        )
    except UsageError as exc:
        print(str(exc), file=err)
        return 2
    except TenantError as exc:
        print(f"{args.host}: {exc}", file=err)
        return 1
    if not outcomes:
        print(f"{args.host}: no guests", file=out)
    for outcome in outcomes:
        print(outcome.line(), file=out)
    return 1 if any(o.failed for o in outcomes) else 0
