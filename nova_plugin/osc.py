"""OpenStack CLI plugin (osc-lib): ``openstack trusted server create``.

Registered under ``openstack.cli.extension`` as ``trusted``; the command
takes the same options as ``trusted-nova boot`` (one shared definition in
:mod:`nova_plugin.bootcli`) and uses the ``openstack`` client's own
keystoneauth session. ``openstack server create`` is left alone.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from osc_lib import exceptions as osc_exceptions
from osc_lib.command import command

from nova_plugin.bootcli import NOVA_API_VERSION, add_boot_arguments, run_boot, summary
from nova_plugin.exceptions import TenantError

API_NAME = "trusted"
API_VERSION_OPTION = "os_trusted_api_version"
DEFAULT_API_VERSION = "1"
API_VERSIONS = {"1": "nova_plugin.osc"}


def make_client(instance: Any) -> Any:
    """The compute client the trusted commands use: novaclient over the
    ``openstack`` client's session."""
    from novaclient import client as nova_client

    version = (getattr(instance, "_api_version", None) or {}).get("compute")
    if not (isinstance(version, str) and version.startswith("2.")):
        version = NOVA_API_VERSION
    return nova_client.Client(
        version,
        session=instance.session,
        region_name=instance.region_name,
        endpoint_type=instance.interface,
    )


def build_option_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The plugin's global option (its API version; there is one)."""
    parser.add_argument(
        "--os-trusted-api-version",
        metavar="<trusted-api-version>",
        default=DEFAULT_API_VERSION,
        help="trusted boot plugin API version (only 1)",
    )
    return parser


class CreateTrustedServer(command.Lister):
    """Create server(s) whose user-data carries only a sealed payload, enrol
    each with the verifier and, with --wait, bootstrap it. On a failure
    once a server exists, this boot's enrolments and servers are removed
    and the error says what is left."""

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        add_boot_arguments(parser)
        return parser

    def take_action(
        self, parsed_args: argparse.Namespace
    ) -> tuple[Sequence[str], list[tuple[Any, ...]]]:
        try:
            nova = self.app.client_manager.trusted  # type: ignore[attr-defined]
            result = run_boot(parsed_args, nova)
        except TenantError as exc:
            raise osc_exceptions.CommandError(str(exc))
        columns = ("id", "name", "trusted", "boot_id")
        rows = summary(result, parsed_args.wait)
        return columns, [tuple(row[c] for c in columns) for row in rows]
