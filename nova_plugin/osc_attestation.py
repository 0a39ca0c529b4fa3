"""OpenStack CLI plugin: ``openstack attestation node|policy ...``.

Registered under ``openstack.cli.extension`` as ``attestation``; the
commands call the verifier found in the catalog (service type
``attestation``) with the ``openstack`` client's own keystoneauth session
(:class:`~nova_plugin.attestation.AttestationClient`), so they take the
usual ``--os-cloud`` / ``OS_*`` credentials and ``-f json|table|value``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from osc_lib import exceptions as osc_exceptions
from osc_lib.command import command

from nova_plugin.attestation import POLICY_KINDS, AttestationClient
from nova_plugin.cliargs import with_base
from nova_plugin.commands.nodes import in_force
from nova_plugin.event_filters import (
    COLUMNS,
    add_event_options,
    event_query,
    event_row,
)
from nova_plugin.exceptions import TenantError, UsageError
from verifier.protocol import MalformedError
from verifier.protocol.messages.enrolment import PolicyChangeRequest
from verifier.protocol.messages.policy_check import PolicyCheckReport

API_NAME = "attestation"
API_VERSION_OPTION = "os_attestation_api_version"
DEFAULT_API_VERSION = "1"
API_VERSIONS = {"1": "nova_plugin.osc_attestation"}

_NODE_COLUMNS = (
    "uuid",
    "state",
    "project_id",
    "last_attested_at",
    "failure_reason",
    "runtime_policy_in_force",
    "mb_policy_in_force",
)
_SHOW = (*_NODE_COLUMNS, "quotes_verified", "runtime_policy", "mb_policy", "policy")
_POLICY_COLUMNS = ("kind", "name", "version", "digest", "entries", "signed")
_EVENT_COLUMNS = (*COLUMNS, "id")
Rows = tuple[Sequence[str], list[tuple[Any, ...]]]
One = tuple[Sequence[str], tuple[Any, ...]]


def make_client(instance: Any) -> AttestationClient:
    """The attestation client over the ``openstack`` client's session."""
    return AttestationClient(instance.session, instance.interface, instance.region_name)


def build_option_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The plugin's global option (its API version; there is one)."""
    parser.add_argument(
        "--os-attestation-api-version",
        metavar="<attestation-api-version>",
        default=DEFAULT_API_VERSION,
        help="attestation API version (only 1)",
    )
    return parser


def service_call(cmd: command.Command, work: Callable[[AttestationClient], Any]) -> Any:
    """Run ``work`` with the client; a service refusal is a CommandError
    (one line, exit status 1), never a traceback."""
    try:
        return work(cmd.app.client_manager.attestation)  # type: ignore[attr-defined]
    except TenantError as exc:
        raise osc_exceptions.CommandError(str(exc))


def _row(data: dict[str, Any], columns: Sequence[str]) -> tuple[Any, ...]:
    words = in_force(data)  # the version in force, and whether it follows
    data = {
        **data,
        "runtime_policy_in_force": words.get("runtime"),
        "mb_policy_in_force": words.get("measured-boot"),
    }
    return tuple(data.get(c) for c in columns)


class _NodeCommand(command.Command):
    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument("uuid", metavar="<uuid>", help="the node (instance UUID)")
        return parser


class ListNode(command.Lister):
    """List the nodes of your project (every project's for an admin)."""

    def take_action(self, parsed_args: argparse.Namespace) -> Rows:
        nodes = service_call(self, lambda c: c.list_nodes())
        return _NODE_COLUMNS, [_row(n, _NODE_COLUMNS) for n in nodes]


class ShowNode(command.ShowOne, _NodeCommand):
    """Show a node's attestation state."""

    def take_action(self, parsed_args: argparse.Namespace) -> One:
        node = service_call(self, lambda c: c.get_node(parsed_args.uuid))
        return _SHOW, _row(node, _SHOW)


class RevokeNode(command.ShowOne, _NodeCommand):
    """Revoke a node: its revocation event goes to every consumer."""

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument("--detail", help="why (in the signed event)")
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> One:
        node = service_call(
            self, lambda c: c.revoke_node(parsed_args.uuid, parsed_args.detail)
        )
        return _SHOW, _row(node, _SHOW)


class SetNode(command.ShowOne, _NodeCommand):
    """Change the runtime or measured-boot policy in force on a node: NAME
    follows that policy (its newest version, now and as newer ones are
    added), NAME@VERSION or a digest pins one. The node is judged with it
    from its next quote on; its IMA replay goes on."""

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        for kind, option in (("runtime", "runtime"), ("measured-boot", "mb")):
            group = parser.add_mutually_exclusive_group()
            group.add_argument(
                f"--{option}-policy",
                metavar="<ref>",
                help=f"the {kind} policy: NAME, NAME@VERSION or digest",
            )
            group.add_argument(
                f"--no-{option}-policy",
                action="store_true",
                help=f"no {kind} policy from now on",
            )
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> One:
        changes: dict[str, str | None] = {}
        for option in ("runtime", "mb"):
            if getattr(parsed_args, f"no_{option}_policy"):
                changes[f"{option}_policy"] = None
            elif getattr(parsed_args, f"{option}_policy") is not None:
                changes[f"{option}_policy"] = getattr(parsed_args, f"{option}_policy")
        try:
            body = PolicyChangeRequest(changes).to_dict()
        except MalformedError as exc:
            raise osc_exceptions.CommandError(
                "give --runtime-policy, --mb-policy, --no-runtime-policy or "
                f"--no-mb-policy ({exc})"
            )
        node = service_call(self, lambda c: c.set_node_policy(parsed_args.uuid, body))
        return _SHOW, _row(node, _SHOW)


class DeleteNode(_NodeCommand):
    """Stop attesting a node and forget it (its events remain)."""

    def take_action(self, parsed_args: argparse.Namespace) -> None:
        service_call(self, lambda c: c.delete_node(parsed_args.uuid))


class NodeEvents(command.Lister):
    """List the signed events of your project's nodes, newest first
    (revoked, failed, unreachable, recovered, policy changed)."""

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument(
            "uuid", metavar="<uuid>", nargs="?", help="one node only (as --node)"
        )
        add_event_options(parser)
        self._parser = parser
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> Rows:
        if parsed_args.uuid:
            parsed_args.node = parsed_args.node or parsed_args.uuid
        try:
            query = event_query(parsed_args, time.time())
        except UsageError as exc:  # a usage error: exit status 2
            self._parser.error(str(exc))
        params, every = query.to_query(), parsed_args.all
        page = service_call(self, lambda c: c.list_events(params, every))
        rows = [event_row(entry) for entry in page["events"]]
        return _EVENT_COLUMNS, [tuple(r[c] for c in _EVENT_COLUMNS) for r in rows]


def _kind(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kind", choices=POLICY_KINDS, default="runtime", help="policy kind"
    )


class CreatePolicy(command.ShowOne):
    """Store a runtime (IMA) or measured-boot policy for your project."""

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        _kind(parser)
        parser.add_argument("--name", help="its name (runtime policies carry one)")
        parser.add_argument(
            "--base",
            metavar="<ref>",
            help="store a runtime policy as a delta over this stored policy "
            "(name, name@version or digest)",
        )
        parser.add_argument("file", help="the policy document (JSON)")
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> One:
        try:
            with open(parsed_args.file, encoding="utf-8") as f:
                document = json.load(f)
        except (OSError, ValueError) as exc:
            raise osc_exceptions.CommandError(f"{parsed_args.file}: {exc}")
        if not isinstance(document, dict):
            raise osc_exceptions.CommandError(f"{parsed_args.file}: not a JSON object")
        if parsed_args.base:
            if parsed_args.kind != "runtime":
                raise osc_exceptions.CommandError("--base: runtime policies only")
            ref = parsed_args.base
            base = service_call(self, lambda c: c.get_policy("runtime", ref))
            try:
                document = with_base(document, base["digest"], ref, parsed_args.file)
            except TenantError as exc:
                raise osc_exceptions.CommandError(str(exc))
        meta = service_call(
            self,
            lambda c: c.create_policy(parsed_args.kind, document, parsed_args.name),
        )
        return _POLICY_COLUMNS, _row(meta, _POLICY_COLUMNS)


class ListPolicy(command.Lister):
    """List your project's policies of one kind."""

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        _kind(parser)
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> Rows:
        rows = service_call(self, lambda c: c.list_policies(parsed_args.kind))
        return _POLICY_COLUMNS, [_row(r, _POLICY_COLUMNS) for r in rows]


class _PolicyRef(command.Command):
    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        _kind(parser)
        parser.add_argument("ref", help="name, name@version or digest")
        return parser


class ShowPolicy(command.ShowOne, _PolicyRef):
    """Show a policy (metadata and document)."""

    def take_action(self, parsed_args: argparse.Namespace) -> One:
        meta = service_call(
            self, lambda c: c.get_policy(parsed_args.kind, parsed_args.ref)
        )
        base = meta.get("base")
        if base:
            meta["base"] = f"{base['name']}@{base['version']} ({base['digest']})"
        columns = (*_POLICY_COLUMNS, "base", "policy")
        return columns, _row(meta, columns)


class DeletePolicy(_PolicyRef):
    """Delete a policy no node of your project uses."""

    def take_action(self, parsed_args: argparse.Namespace) -> None:
        service_call(self, lambda c: c.delete_policy(parsed_args.kind, parsed_args.ref))


class CheckPolicy(command.Lister):
    """Dry-run a runtime policy: what it would refuse of each node's live
    IMA list (exit status 1 if any node would fail or could not be
    checked). Nothing changes on any node."""

    _COLUMNS = ("node", "result", "entries", "failures", "error")

    def get_parser(self, prog_name: str) -> argparse.ArgumentParser:
        parser = super().get_parser(prog_name)
        parser.add_argument("ref", help="name, name@version or digest")
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument(
            "--node",
            action="append",
            default=[],
            metavar="<uuid>",
            help="a node to check (repeatable)",
        )
        which.add_argument(
            "--all", action="store_true", help="every node of your project"
        )
        return parser

    def take_action(self, parsed_args: argparse.Namespace) -> Rows:
        data = service_call(
            self,
            lambda c: c.check_policy(
                parsed_args.ref, parsed_args.node, parsed_args.all
            ),
        )
        try:
            report = PolicyCheckReport.from_dict(data)
        except MalformedError as exc:
            raise osc_exceptions.CommandError(f"the verifier's report: {exc}")
        self.passed = report.passed
        rows = []
        for node in report.results:
            failing = "\n".join(
                f"{f.index} {f.path}: {f.reason}" for f in node.failures
            )
            row = (node.node, node.result.value, node.entries, failing, node.error)
            rows.append(row)
        return self._COLUMNS, rows

    def run(self, parsed_args: argparse.Namespace) -> int:
        self.passed = False
        status: int = super().run(parsed_args)
        return status or (0 if self.passed else 1)
