"""``trusted-ima-policy``: build and check IMA runtime policies.

Examples::

    # from a known-good root file system (an image, a chroot)
    trusted-ima-policy from-tree /srv/image --name web --version 3 \\
        --exclude '/tmp/.*' --exclude '/var/log/.*' -o web-3.json

    # from the measurement list of a known-good node
    trusted-ima-policy from-log binary_runtime_measurements --name web \\
        --version 3 -o web-3.json --sign-key tenant-ed25519.pem

    # which entries of a list a policy would refuse
    trusted-ima-policy check web-3.json ascii_runtime_measurements

Policies are JSON; ``--sign-key`` also writes a detached signature to
``<output>.sig`` (Ed25519 or ECDSA P-256 private key, PEM).
"""

from __future__ import annotations

import argparse
import json
import sys

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from verifier.common import version
from verifier.common.imagefiles import ImageFilesError, tree_files
from verifier.exceptions import VerifierError
from verifier.protocol import ProtocolError, jsonlimits
from verifier.protocol.ima import (
    ImaEntry,
    RuntimePolicy,
    evaluate,
    parse_ascii,
    parse_binary,
    policy_from_log,
    sign,
)

_CHUNK = 1 << 20


class _InputError(VerifierError):
    """A file that cannot be used; the message names it."""


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise _InputError(f"{path}: {exc.strerror or exc}") from None


def _read_log(path: str) -> list[ImaEntry]:
    data = _read(path)
    head = data[:64]
    try:
        if head[:3].isdigit() or head[:2].isdigit():  # "10 <hex> ima-ng ..."
            return parse_ascii(data)
        return parse_binary(data)
    except ProtocolError as exc:
        raise _InputError(f"{path}: {exc}") from None


def _read_policy(path: str) -> RuntimePolicy:
    try:
        return RuntimePolicy.from_dict(
            jsonlimits.loads(_read(path), "runtime policy", object_only=True)
        )
    except ProtocolError as exc:
        raise _InputError(f"{path}: {exc}") from None


def _write(policy: RuntimePolicy, output: str, sign_key: str | None) -> None:
    with open(output, "w", encoding="utf-8") as f:
        json.dump(policy.to_dict(), f, indent=1, sort_keys=True)
    if sign_key:
        with open(sign_key, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), None)
        if not isinstance(key, ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey):
            raise ValueError(f"{sign_key}: not an Ed25519 or ECDSA private key")
        with open(output + ".sig", "wb") as f:
            f.write(sign(policy, key))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trusted-ima-policy", description="Build and check IMA runtime policies."
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (
        ("from-tree", "allow every regular file of a root file system"),
        ("from-log", "allow every file measured in a known-good node's list"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument(
            "source",
            help="root directory"
            if name == "from-tree"
            else "ascii or binary runtime measurement list",
        )
        cmd.add_argument("--name", required=True, help="policy name")
        cmd.add_argument("--version", type=int, required=True, help="policy version")
        cmd.add_argument(
            "--exclude",
            action="append",
            default=[],
            metavar="REGEX",
            help="paths not checked (repeatable; anchored at the start)",
        )
        cmd.add_argument("-o", "--output", required=True, help="policy JSON to write")
        cmd.add_argument("--sign-key", help="PEM private key: also write OUTPUT.sig")
        if name == "from-tree":
            cmd.add_argument(
                "--algorithm",
                action="append",
                default=None,
                help="digest algorithms (default sha256; repeatable)",
            )
    check = sub.add_parser("check", help="list the entries a policy refuses")
    check.add_argument("policy", help="policy JSON")
    check.add_argument("log", help="ascii or binary runtime measurement list")
    return p


def _run(args: argparse.Namespace) -> int:
    if args.command == "check":
        policy = _read_policy(args.policy)
        failures = evaluate(policy, _read_log(args.log)[1:], first_index=1)
        for fail in failures:
            print(f"entry {fail.index} {fail.path}: {fail.reason}: {fail.detail}")
        print(
            f"{len(failures)} entr{'y' if len(failures) == 1 else 'ies'} refused "
            f"by {policy.name} v{policy.version}"
        )
        return 1 if failures else 0
    if args.command == "from-tree":
        allow = dict(tree_files(args.source, args.algorithm or ["sha256"]))
        policy = RuntimePolicy(args.name, args.version, allow, args.exclude, (), {})
    else:
        policy = policy_from_log(
            _read_log(args.source), args.name, args.version, args.exclude
        )
    _write(policy, args.output, args.sign_key)
    print(f"wrote {args.output}: policy {policy.name} v{policy.version}")
    return 0


def main(argv: list[str] | None = None) -> int:
    version.exit_if_asked(argv, "trusted-ima-policy")
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except _InputError as exc:
        print(f"trusted-ima-policy: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(
            f"trusted-ima-policy: error: {where}{exc.strerror or exc}", file=sys.stderr
        )
        return 2
    except (ValueError, ProtocolError, ImageFilesError) as exc:
        print(f"trusted-ima-policy: error: {exc}", file=sys.stderr)
        return 2
