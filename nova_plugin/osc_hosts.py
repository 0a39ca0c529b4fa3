"""OpenStack CLI plugin: ``openstack attestation host enrol|list|show|
delete`` -- the operator's compute hosts (trusted compute pools,
doc/source/admin/compute-pools.rst).

Like ``openstack attestation node``, the commands call the verifier found
in the catalog with the ``openstack`` client's own session; only an
administrator or a service user may (a project member gets 403). A bad
argument is a usage error (one line, exit status 2); a refusal of the
verifier one line and exit status 1.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from osc_lib.command import command

from nova_plugin.osc_attestation import service_call
from verifier.protocol import MalformedError, PcrPolicy
from verifier.protocol.messages.hosts import DEFAULT_CA_PATH, HostEnrolmentRequest

__all__ = ["DeleteHost", "EnrolHost", "ListHost", "ShowHost"]

_COLUMNS = (
    "hypervisor_hostname",
    "provider",
    "state",
    "trusted",
    "as_of",
    "last_attested_at",
    "ca_sha256",
)
_SHOW = (*_COLUMNS, "failure_reason", "ca_path", "quotes_verified", "guests")


def _row(host: dict[str, Any], columns: Sequence[str]) -> tuple[Any, ...]:
    return tuple(host.get(c) for c in columns)


def _pcr_policy(path: str | None) -> PcrPolicy:
    """``--pcr-policy FILE``: a PCR policy document (JSON), or none."""
    if path is None:
        return PcrPolicy({})
    try:
        with open(path, encoding="utf-8") as f:
            return PcrPolicy.from_dict(json.load(f), allow_empty=True)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"--pcr-policy {path}: {exc.strerror}")
    except (ValueError, MalformedError) as exc:
        raise argparse.ArgumentTypeError(f"--pcr-policy {path}: {exc}")


class _HostCommand(command.Command):
    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument(
            "host", metavar="<host>", help="hypervisor host name or provider UUID"
        )
        return parser


class EnrolHost(command.ShowOne):
    """Enrol a compute host for attestation under its compute node's
    Placement resource provider; its host agent must have registered under
    that UUID. Policies are stored ones of your project."""

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument(
            "--provider", metavar="<uuid>", required=True,
            help="the compute node's resource provider UUID (openstack "
            "resource provider list)",
        )  # fmt: skip
        parser.add_argument(
            "--hypervisor", metavar="<name>", required=True,
            help="the hypervisor host name (openstack hypervisor list)",
        )  # fmt: skip
        parser.add_argument(
            "--runtime-policy", metavar="<ref>",
            help="stored IMA runtime policy: NAME, NAME@VERSION or digest",
        )  # fmt: skip
        parser.add_argument(
            "--mb-policy", metavar="<ref>",
            help="stored measured-boot policy: NAME, NAME@VERSION or digest",
        )  # fmt: skip
        parser.add_argument(
            "--pcr-policy", metavar="<file>",
            help="PCR policy (JSON: {\"hash\": \"sha256\", \"pcrs\": {...}})",
        )  # fmt: skip
        parser.add_argument(
            "--ca-path", metavar="<path>", default=DEFAULT_CA_PATH,
            help="the swtpm local CA certificate file measured in the host's "
            f"IMA list (default {DEFAULT_CA_PATH})",
        )  # fmt: skip
        parser.add_argument(
            "--interval", metavar="<seconds>", type=float,
            help="the host's own quote interval (default: the verifier's)",
        )  # fmt: skip
        self._parser = parser
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> Any:
        try:
            request = HostEnrolmentRequest(
                parsed_args.provider,
                parsed_args.hypervisor,
                _pcr_policy(parsed_args.pcr_policy),
                parsed_args.runtime_policy,
                parsed_args.mb_policy,
                parsed_args.ca_path,
                parsed_args.interval,
            )
        except (MalformedError, argparse.ArgumentTypeError) as exc:
            self._parser.error(str(exc))  # exit status 2
        host = service_call(self, lambda c: c.enrol_host(request.to_dict()))
        return _SHOW, _row(host, _SHOW)


class ListHost(command.Lister):
    """List the enrolled compute hosts and their verdicts."""

    def take_action(self, parsed_args: argparse.Namespace) -> Any:
        hosts = service_call(self, lambda c: c.list_hosts())
        return _COLUMNS, [_row(h, _COLUMNS) for h in hosts]


class ShowHost(command.ShowOne, _HostCommand):
    """Show a compute host: its verdict, its proven CA and its guests."""

    def take_action(self, parsed_args: argparse.Namespace) -> Any:
        host = service_call(self, lambda c: c.get_host(parsed_args.host))
        return _SHOW, _row(host, _SHOW)


class DeleteHost(_HostCommand):
    """Stop attesting a compute host and forget it: its trait goes and the
    registrar stops trusting its CA. Its guests are not marked."""

    def take_action(self, parsed_args: argparse.Namespace) -> None:
        service_call(self, lambda c: c.delete_host(parsed_args.host))
