"""``trusted-tenant policy add|generate|list|show|delete|check``: the
runtime (IMA) and measured-boot policies stored at the verifier, which
enrolments name (``enrol --runtime-policy``, ``--mb-policy``);
``generate``, which builds one from a guest image offline
(:mod:`nova_plugin.policygen`); and ``check``, the dry run of a runtime
policy on the nodes' live IMA lists before it is published.

``policy add FILE --base REF`` stores a runtime policy as a delta over the
stored policy ``REF`` names: the base's digest is written into the
document's ``"base"`` before it is signed (``--sign-key``) and uploaded.
``policy check --file FILE [--base REF]`` dry-runs a document that is not
stored (the same ``--base``), so a node that follows the name can be
checked before ``policy add`` moves it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from nova_plugin.cliargs import with_base
from nova_plugin.commands.base import (
    HANDLER,
    CommandGroup,
    LocalCommand,
    Subparsers,
    TenantCommand,
)
from nova_plugin.exceptions import ServiceError, UsageError
from nova_plugin.policygen import add_generate_parser, generate
from nova_plugin.tenant import Tenant
from verifier.protocol import MalformedError, canonical_uuid, jsonlimits
from verifier.protocol.ima.policy import canonical_document
from verifier.protocol.ima.signing import SigningKey
from verifier.protocol.messages.policy_check import (
    MAX_CHECK_NODES,
    CheckResult,
    PolicyCheckReport,
)

__all__ = [
    "PolicyAdd",
    "PolicyCheck",
    "PolicyDelete",
    "PolicyGenerate",
    "PolicyGroup",
    "PolicyList",
    "PolicyShow",
]


def _add_ref(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ref", help="NAME, NAME@VERSION or digest")


def _read_policy(path: str) -> dict[str, Any]:
    """A policy file as a JSON object.

    Raises:
        UsageError: unreadable, or not a JSON object (one line naming it).
    """
    try:
        with open(path, "rb") as f:
            document = jsonlimits.loads(f.read(), path, object_only=True)
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    except MalformedError as exc:
        raise UsageError(f"{path}: {exc.detail}") from None
    return dict(document)


class PolicyAdd(TenantCommand):
    name = "add"
    help = "store a policy file at the verifier"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("file", help="the policy (JSON)")
        parser.add_argument(
            "--name", help="the policy's name (required for measured-boot policies)"
        )
        sign = parser.add_mutually_exclusive_group()
        sign.add_argument(
            "--signature", metavar="FILE", help="detached signature (raw bytes)"
        )
        sign.add_argument(
            "--sign-key",
            metavar="PEM",
            help="sign the runtime policy as sent (with its --base) with this "
            "Ed25519 or ECDSA P-256 private key",
        )
        parser.add_argument(
            "--base",
            metavar="REF",
            help="store a runtime policy as a delta over the stored policy REF "
            "(NAME, NAME@VERSION or digest): its additions only, same name, "
            "higher version",
        )

    def check(self, args: argparse.Namespace) -> None:
        if args.kind != "runtime":
            for option in ("base", "sign_key"):
                if getattr(args, option):
                    raise UsageError(
                        f"--{option.replace('_', '-')}: runtime policies only"
                    )

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
        document = _read_policy(args.file)
        signature = None
        if args.signature:
            with open(args.signature, "rb") as f:
                signature = f.read()
        if args.base:
            if signature is not None and "base" not in document:
                raise UsageError(
                    f"--signature {args.signature} covers {args.file} as it is, "
                    "without a base: sign the delta with --sign-key instead"
                )
            base = await tenant.policy("runtime", args.base)
            document = with_base(document, str(base["digest"]), args.base, args.file)
        if args.sign_key:
            signature = _sign(document, args.file, args.sign_key)
        meta = await tenant.add_policy(args.kind, document, args.name, signature)
        over = ""
        if meta.get("base"):
            over = f" over version {meta['base']['version']}"
        return {
            "message": f"{args.kind} policy {meta['name']!r} version "
            f"{meta['version']} stored{over} ({meta['entries']} entries, digest "
            f"{meta['digest'][:16]}...)"
        }


def _sign(document: dict[str, Any], where: str, key_file: str) -> bytes:
    """A signature over the runtime policy's canonical JSON, as the verifier
    checks it (a delta's ``"base"`` included).

    Raises:
        UsageError: an unreadable key or not a signing key; a policy the
            verifier would refuse.
    """
    try:
        with open(key_file, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), None)
    except OSError as exc:
        raise UsageError(f"--sign-key {key_file}: {exc.strerror or exc}") from None
    except (ValueError, TypeError) as exc:
        raise UsageError(f"--sign-key {key_file}: {exc}") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey):
        raise UsageError(f"--sign-key {key_file}: not an Ed25519 or ECDSA key")
    try:
        data = canonical_document(document)
    except MalformedError as exc:
        raise UsageError(f"{where}: {exc.detail}") from None
    signer: SigningKey = key
    if isinstance(signer, ed25519.Ed25519PrivateKey):
        return signer.sign(data)
    return signer.sign(data, ec.ECDSA(hashes.SHA256()))


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
            + (f"  delta over @{r['base']['version']}" if r.get("base") else "")
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


class PolicyCheck(TenantCommand):
    name = "check"
    help = (
        "dry run: what a runtime policy would refuse of nodes' live IMA "
        "lists (exit 1 if any node would fail or could not be checked)"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "ref",
            nargs="?",
            help="the stored policy to check: NAME, NAME@VERSION or digest (or --file)",
        )
        parser.add_argument(
            "--file",
            metavar="FILE",
            help="check this runtime policy document instead, before it is "
            "stored (not signed: nothing is stored); a node that follows the "
            "policy's name can be checked before `policy add` moves it",
        )
        parser.add_argument(
            "--base",
            metavar="REF",
            help="with --file: the document is a delta over the stored policy "
            "REF (NAME, NAME@VERSION or digest), as `policy add --base`",
        )
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument(
            "--node",
            action="append",
            default=[],
            metavar="UUID",
            help=f"a node to check (repeatable, at most {MAX_CHECK_NODES})",
        )
        which.add_argument(
            "--all", action="store_true", help="every node of your project"
        )
        parser.add_argument(
            "--json",
            action="store_true",
            default=argparse.SUPPRESS,  # else the top level's --json
            help="print the verifier's report as JSON",
        )

    def check(self, args: argparse.Namespace) -> None:
        if args.kind != "runtime":
            raise UsageError("policy check: only runtime policies (--kind runtime)")
        if (args.ref is None) == (args.file is None):
            raise UsageError(
                "policy check: give exactly one of REF (a stored policy) or --file"
            )
        if args.base and args.file is None:
            raise UsageError("--base: only with --file (a document to check)")
        for node in args.node:
            try:
                canonical_uuid(node)
            except MalformedError as exc:
                raise UsageError(f"--node: {exc.detail}") from None
        if len(set(args.node)) > MAX_CHECK_NODES:
            raise UsageError(f"--node: at most {MAX_CHECK_NODES} nodes (or --all)")

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
        nodes = tuple(args.node)
        try:
            if args.file is None:
                report = await tenant.check_policy(args.ref, nodes, args.all)
            else:
                document = _read_policy(args.file)
                if args.base:
                    base = await tenant.policy("runtime", args.base)
                    document = with_base(
                        document, str(base["digest"]), args.base, args.file
                    )
                report = await tenant.check_candidate(document, nodes, args.all)
        except ServiceError as exc:
            if exc.status in (400, 404, 413):  # the policy or a node named wrong
                raise UsageError(str(exc)) from None
            raise
        return report.to_dict()

    def lines(self, result: Any) -> list[str]:
        report = PolicyCheckReport.from_dict(result)
        counts = {r: 0 for r in CheckResult}
        for node in report.results:
            counts[node.result] += 1
        policy = report.policy
        out = [
            f"runtime policy {policy} ({policy.digest[:16]}...): "
            f"{len(report.results)} node(s) checked, {counts[CheckResult.PASS]} "
            f"pass, {counts[CheckResult.FAIL]} would fail, "
            f"{counts[CheckResult.ERROR]} could not be checked"
        ]
        for node in report.results:
            if node.result is CheckResult.PASS:
                out.append(f"{node.node}: PASS ({node.entries} entries)")
            elif node.result is CheckResult.ERROR:
                out.append(f"{node.node}: ERROR {node.error}")
            else:
                out.append(
                    f"{node.node}: FAIL ({node.failures_total} of {node.entries} "
                    "entries would fail)"
                )
                out += [
                    f"    entry {f.index} {f.path!r}: {f.reason}: {f.detail}"
                    for f in node.failures
                ]
                hidden = node.failures_total - len(node.failures)
                if hidden:
                    out.append(f"    ... and {hidden} more")
        return out

    def exit_status(self, result: Any) -> int:
        return 0 if PolicyCheckReport.from_dict(result).passed else 1


class PolicyGroup(CommandGroup):
    """``policy``: every subcommand takes ``--kind`` (last in its help)."""

    name = "policy"
    help = (
        "store, list, show and delete runtime/measured-boot policies; "
        "dry-run a runtime policy on live nodes"
    )
    dest = "policy_command"
    commands = (
        PolicyAdd(),
        PolicyGenerate(),
        PolicyList(),
        PolicyShow(),
        PolicyDelete(),
        PolicyCheck(),
    )

    def add_common_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--kind",
            choices=("runtime", "measured-boot"),
            default="runtime",
            help="policy kind (default: runtime)",
        )
