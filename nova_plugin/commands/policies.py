"""``trusted-tenant policy add|generate|list|show|delete``: the runtime
(IMA) and measured-boot policies stored at the verifier, which enrolments
name (``enrol --runtime-policy``, ``--mb-policy``), and ``generate``,
which builds one from a guest image offline (:mod:`nova_plugin.policygen`).

``policy add FILE --base REF`` stores a runtime policy as a delta over the
stored policy ``REF`` names: the base's digest is written into the
document's ``"base"`` before it is signed (``--sign-key``) and uploaded.
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
from nova_plugin.exceptions import UsageError
from nova_plugin.policygen import add_generate_parser, generate
from nova_plugin.tenant import Tenant
from verifier.protocol import MalformedError, jsonlimits
from verifier.protocol.ima.policy import canonical_document
from verifier.protocol.ima.signing import SigningKey

__all__ = [
    "PolicyAdd",
    "PolicyDelete",
    "PolicyGenerate",
    "PolicyGroup",
    "PolicyList",
    "PolicyShow",
]


def _add_ref(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ref", help="NAME, NAME@VERSION or digest")


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
        try:
            with open(args.file, "rb") as f:
                document = jsonlimits.loads(f.read(), args.file, object_only=True)
        except OSError as exc:
            raise UsageError(f"{args.file}: {exc.strerror or exc}") from None
        except MalformedError as exc:
            raise UsageError(f"{args.file}: {exc.detail}") from None
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


class PolicyGroup(CommandGroup):
    """``policy``: every subcommand takes ``--kind`` (last in its help)."""

    name = "policy"
    help = "store, list, show and delete runtime/measured-boot policies"
    dest = "policy_command"
    commands = (
        PolicyAdd(),
        PolicyGenerate(),
        PolicyList(),
        PolicyShow(),
        PolicyDelete(),
    )

    def add_common_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--kind",
            choices=("runtime", "measured-boot"),
            default="runtime",
            help="policy kind (default: runtime)",
        )
