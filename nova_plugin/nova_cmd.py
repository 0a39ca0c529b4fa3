"""``trusted-nova boot``: ``nova boot`` with a sealed payload and enrolment.

Authentication is keystoneauth's (``--os-auth-type``, ``--os-auth-url``,
... or the usual ``OS_*`` environment); the verifier settings are those of
``trusted-tenant`` (``TRUSTED_*``). See doc/source/user/boot.rst.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from keystoneauth1 import exceptions as ks_exc
from keystoneauth1 import loading as ks_loading

from nova_plugin.bootcli import NOVA_API_VERSION, add_boot_arguments, run_boot, summary
from nova_plugin.exceptions import TenantError, UsageError
from verifier.common import version

__all__ = ["main", "parser"]


def parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trusted-nova",
        description="Boot Nova servers whose user-data carries only a sealed "
        "payload, enrol them with the verifier, and bootstrap them.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="<command>")
    boot = sub.add_parser(
        "boot",
        help="boot server(s) with an encrypted payload and enrol them",
        description="Like 'nova boot', plus: the payload is sealed under a "
        "fresh key before Nova sees it, each new instance UUID is enrolled "
        "with the verifier, and with --wait the bootstrap is driven to the "
        "end. If anything fails once a server exists, this boot's enrolments "
        "and servers are removed and the error says what is left.",
    )
    add_boot_arguments(boot)
    ks_loading.register_session_argparse_arguments(boot)
    ks_loading.register_auth_argparse_arguments(
        boot, list(argv if argv is not None else sys.argv[1:]), default="password"
    )
    auth = boot.add_argument_group("compute endpoint")
    auth.add_argument(
        "--os-compute-api-version",
        default=os.environ.get("OS_COMPUTE_API_VERSION", NOVA_API_VERSION),
        metavar="<version>",
        help=f"Compute API microversion (default: $OS_COMPUTE_API_VERSION or "
        f"{NOVA_API_VERSION})",
    )
    auth.add_argument(
        "--os-region-name",
        default=os.environ.get("OS_REGION_NAME"),
        metavar="<region>",
        help="region of the compute endpoint (default: $OS_REGION_NAME)",
    )
    auth.add_argument(
        "--os-interface",
        default=os.environ.get("OS_INTERFACE", "public"),
        metavar="<interface>",
        help="endpoint interface: public, internal or admin (default: "
        "$OS_INTERFACE or public)",
    )
    auth.add_argument(
        "--nova-header",
        action="append",
        default=[],
        metavar="<name:value>",
        help="extra HTTP header on every Nova request (repeatable), e.g. "
        "X-User-Id/X-Project-Id/X-Roles for a Nova API deployed without "
        "keystone (--os-auth-type none --os-endpoint URL)",
    )
    return p


def _nova(args: argparse.Namespace) -> Any:
    from novaclient import client as nova_client

    auth = ks_loading.load_auth_from_argparse_arguments(args)
    session = ks_loading.load_session_from_argparse_arguments(args, auth=auth)
    for item in args.nova_header:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise UsageError(f"--nova-header {item!r}: expected NAME:VALUE")
        session.additional_headers[name.strip()] = value.strip()
    return nova_client.Client(
        args.os_compute_api_version,
        session=session,
        region_name=args.os_region_name,
        endpoint_type=args.os_interface,
    )


def main(argv: list[str] | None = None) -> int:
    version.exit_if_asked(argv, "trusted-nova")
    args = parser(argv).parse_args(argv)
    try:
        result = run_boot(args, _nova(args))
    except UsageError as exc:
        print(f"trusted-nova: error: {exc}", file=sys.stderr)
        return 2
    except TenantError as exc:
        print(f"trusted-nova: error: {exc}", file=sys.stderr)
        return 1
    except ks_exc.ClientException as exc:
        print(
            f"trusted-nova: error: cannot talk to Nova: {exc}; no server was created",
            file=sys.stderr,
        )
        return 1
    for row in summary(result, args.wait):
        print(json.dumps(row, sort_keys=True))
    return 0
