"""The shape of a ``trusted-tenant`` subcommand.

A command declares its arguments (:meth:`Command.add_arguments`), says
what it needs of the connection settings (:class:`TenantCommand`) and
runs: on a :class:`~nova_plugin.tenant.Tenant` built from those settings,
or offline (:class:`LocalCommand`). Its result is a JSON object, printed
as is with ``--json`` and otherwise as the lines :meth:`Command.lines`
makes of it. A group of subcommands under one word (``policy add``,
``policy list``, ...) is a :class:`CommandGroup`.
"""

from __future__ import annotations

import abc
import argparse
from collections.abc import Sequence
from typing import Any, ClassVar, TypeAlias

from nova_plugin.cliargs import pcr_policy
from nova_plugin.exceptions import UsageError
from nova_plugin.tenant import Tenant
from verifier.protocol import PcrPolicy

__all__ = [
    "HANDLER",
    "Command",
    "CommandGroup",
    "LocalCommand",
    "Subparsers",
    "TenantCommand",
    "add_pcr_options",
    "read_pcr_policy",
    "readable",
]

#: What ``ArgumentParser.add_subparsers`` returns.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

#: The namespace attribute that carries the chosen command.
HANDLER = "handler"


class Command(abc.ABC):
    """One subcommand.

    Attributes:
        name: its word on the command line.
        help: its line in the help of the word above it.
    """

    name: ClassVar[str]
    help: ClassVar[str]

    def add_to(self, subparsers: Subparsers) -> argparse.ArgumentParser:
        """Add this command to ``subparsers``; its parser."""
        parser: argparse.ArgumentParser = subparsers.add_parser(
            self.name, help=self.help
        )
        self.add_arguments(parser)
        parser.set_defaults(**{HANDLER: self})
        return parser

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:  # noqa: B027
        """Declare the command's own arguments (by default none)."""

    def lines(self, result: Any) -> list[str]:
        """The result as text (without ``--json``): by default its
        ``message``."""
        return [result["message"]]

    def exit_status(self, result: Any) -> int:
        """The exit status of a command that ran to its result (by
        default 0; e.g. 1 for a check whose result is a failure)."""
        return 0

    def resolve(self, args: argparse.Namespace) -> Command:
        """The command that runs with ``args`` (by default this one; e.g.
        an offline variant chosen by an option)."""
        return self


class LocalCommand(Command):
    """A command that needs no service and no credentials (a failure is
    exit status 1)."""

    @abc.abstractmethod
    def run(self, args: argparse.Namespace) -> dict[str, Any]:
        """Run; the result.

        Raises:
            TenantError, OSError: the message for the user.
        """


class TenantCommand(Command):
    """A command that talks to the verifier (and the registrar, or a
    node's agent) as the tenant.

    Attributes:
        needs_registrar: the registrar's URL is required.
        agent_api: it calls a node's agent's own API (directly, with the
            tenant certificate), so the certificate settings are required
            even on a Keystone session.
        extra: the ``trusted-cloud`` extra it needs installed, if any.
    """

    needs_registrar: ClassVar[bool] = False
    agent_api: ClassVar[bool] = False
    extra: ClassVar[str | None] = None

    def check(self, args: argparse.Namespace) -> None:
        """Check the command's own input before any connection is made
        (by default nothing).

        Raises:
            UsageError: naming the option.
        """

    @abc.abstractmethod
    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
        """Run; the result (a JSON object).

        Raises:
            TenantError, MalformedError, OSError: the message for the user
                (:class:`UsageError`: bad input).
        """


class CommandGroup:
    """A word whose subcommands come after it (``policy add``).

    Attributes:
        name: the word.
        help: its line in the top-level help.
        dest: where the subcommand's word is kept (it names the argument in
            argparse's messages).
        commands: the subcommands, in the order the help lists them.
    """

    name: ClassVar[str]
    help: ClassVar[str]
    dest: ClassVar[str]
    commands: ClassVar[Sequence[Command]]

    def add_to(self, subparsers: Subparsers) -> argparse.ArgumentParser:
        """Add the group and its subcommands to ``subparsers``; its parser."""
        parser: argparse.ArgumentParser = subparsers.add_parser(
            self.name, help=self.help
        )
        sub = parser.add_subparsers(dest=self.dest, required=True)
        for leaf in [command.add_to(sub) for command in self.commands]:
            self.add_common_arguments(leaf)
        return parser

    def add_common_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Declare the arguments every subcommand takes, after its own (by
        default none)."""


def readable(option: str, path: str) -> None:
    """Raises: UsageError naming ``option`` and ``path`` if it cannot be read."""
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror or exc}") from None


def add_pcr_options(parser: argparse.ArgumentParser, whose: str) -> None:
    """``--pcr N=HEX`` (repeatable) and ``--policy FILE``: the PCR values
    accepted of ``whose`` TPM."""
    parser.add_argument(
        "--pcr",
        action="append",
        default=[],
        metavar="N=HEX",
        help=f"allowed sha256 value of PCR N {whose} (repeatable)",
    )
    parser.add_argument(
        "--policy", help='JSON PCR policy file ({"pcrs": {"16": ["<hex>"]}})'
    )


def read_pcr_policy(
    args: argparse.Namespace, *, stored: bool = False, missing: str
) -> PcrPolicy:
    """The PCR policy of :func:`add_pcr_options` (empty when only
    ``stored`` policies judge the quotes).

    Raises:
        UsageError: ``missing``, or an unreadable or invalid policy.
    """
    return pcr_policy(
        args.policy, args.pcr, file_option="--policy", stored=stored, missing=missing
    )
