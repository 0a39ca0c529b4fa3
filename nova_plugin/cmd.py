"""``trusted-tenant``: enrol nodes, watch them, revoke them.

Connection settings come from options or the environment
(``TRUSTED_REGISTRAR_URL``, ``TRUSTED_VERIFIER_URL``, ``TRUSTED_CERT``,
``TRUSTED_KEY``, ``TRUSTED_CA``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from nova_plugin.exceptions import TenantError
from nova_plugin.tenant import Tenant, TenantConfig
from verifier.protocol import MalformedError, PcrPolicy

_ENV = {
    "registrar": "TRUSTED_REGISTRAR_URL",
    "verifier": "TRUSTED_VERIFIER_URL",
    "cert": "TRUSTED_CERT",
    "key": "TRUSTED_KEY",
    "ca": "TRUSTED_CA",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trusted-tenant",
        description="Enrol nodes with an encrypted payload, check their "
        "attestation status, and revoke them.",
    )
    for name, env in _ENV.items():
        p.add_argument(
            f"--{name}", default=os.environ.get(env), help=f"(default: ${env})"
        )
    p.add_argument("--json", action="store_true", help="print JSON")
    sub = p.add_subparsers(dest="command", required=True)
    enrol = sub.add_parser("enrol", help="enrol a node with a payload and a policy")
    enrol.add_argument("uuid", help="the node's UUID")
    enrol.add_argument(
        "--payload",
        required=True,
        help="file to deliver; a script starting with #! is run",
    )
    enrol.add_argument(
        "--pcr",
        action="append",
        default=[],
        metavar="N=HEX",
        help="allowed sha256 value of PCR N (repeatable)",
    )
    enrol.add_argument(
        "--policy", help='JSON PCR policy file ({"pcrs": {"16": ["<hex>"]}})'
    )
    enrol.add_argument(
        "--runtime-policy",
        metavar="NAME",
        help="IMA runtime policy stored at the verifier ('trusted-tenant policy "
        "add'): NAME, NAME@VERSION or its digest; PCR 10 is then quoted and "
        "the IMA log replayed and judged on every quote",
    )
    enrol.add_argument(
        "--mb-policy",
        metavar="NAME",
        help="measured-boot policy stored at the verifier; PCRs 0-9 are then "
        "quoted and the firmware event log replayed and judged once per boot",
    )
    pol = sub.add_parser(
        "policy", help="store, list, show and delete runtime/measured-boot policies"
    )
    pol_sub = pol.add_subparsers(dest="policy_command", required=True)
    add = pol_sub.add_parser("add", help="store a policy file at the verifier")
    add.add_argument("file", help="the policy (JSON)")
    add.add_argument(
        "--name", help="the policy's name (required for measured-boot policies)"
    )
    add.add_argument(
        "--signature", metavar="FILE", help="detached signature (raw bytes)"
    )
    for name, text in (
        ("list", "list stored policies"),
        ("show", "show one policy"),
        ("delete", "delete a policy no node uses"),
    ):
        cmd = pol_sub.add_parser(name, help=text)
        if name != "list":
            cmd.add_argument("ref", help="NAME, NAME@VERSION or digest")
    for cmd in pol_sub.choices.values():
        cmd.add_argument(
            "--kind",
            choices=("runtime", "measured-boot"),
            default="runtime",
            help="policy kind (default: runtime)",
        )
    for name, text in (
        ("status", "show a node's attestation state"),
        ("delete", "stop attesting a node and forget it"),
    ):
        sub.add_parser(name, help=text).add_argument("uuid")
    revoke = sub.add_parser("revoke", help="revoke a node now")
    revoke.add_argument("uuid")
    revoke.add_argument("--detail", default="revoked by the tenant")
    sub.add_parser("list", help="list enrolled nodes")
    events = sub.add_parser("events", help="show revocation events")
    events.add_argument("uuid", nargs="?")
    return p


def _policy(args: argparse.Namespace) -> PcrPolicy:
    if args.policy:
        with open(args.policy, encoding="utf-8") as f:
            return PcrPolicy.from_dict(json.load(f))
    pcrs: dict[str, list[str]] = {}
    for item in args.pcr:
        index, sep, value = item.partition("=")
        if not sep:
            raise TenantError(f"--pcr {item!r}: expected N=HEX")
        pcrs.setdefault(index, []).append(value)
    if not pcrs:
        if args.runtime_policy or args.mb_policy:
            return PcrPolicy({})
        raise TenantError(
            "give --pcr N=HEX, --policy FILE, --runtime-policy or --mb-policy"
        )
    return PcrPolicy.from_dict({"pcrs": pcrs})


def _describe(node: Mapping[str, Any]) -> str:
    state = node["state"]
    words = {
        "registered": "enrolled, waiting for its first integrity quote",
        "bootstrapping": "passed its first quote, receiving its key share",
        "attested": "trusted: its TPM quotes match the policy",
        "failed": "not answering the verifier",
        "revoked": "REVOKED",
    }.get(state, state)
    line = f"{node['uuid']}: {words} ({node['quotes_verified']} quotes verified)"
    if node.get("ima_entries") is not None:
        line += f"\n    IMA entries verified: {node['ima_entries']}"
    if node.get("failure_reason"):
        line += f"\n    reason: {node['failure_reason']}"
    return line


async def _run(args: argparse.Namespace) -> Any:
    missing = [n for n in _ENV if not getattr(args, n)]
    if missing:
        raise TenantError(
            "missing settings: " + ", ".join(f"--{n} (or ${_ENV[n]})" for n in missing)
        )
    tenant = Tenant(
        TenantConfig(
            args.registrar.rstrip("/"),
            args.verifier.rstrip("/"),
            args.cert,
            args.key,
            args.ca,
        )
    )
    try:
        if args.command == "enrol":
            with open(args.payload, "rb") as f:
                payload = f.read()
            result = await tenant.enrol(
                args.uuid,
                payload,
                _policy(args),
                runtime_policy=args.runtime_policy,
                mb_policy=args.mb_policy,
            )
            return {
                "uuid": result.uuid,
                "state": result.state,
                "message": f"node {result.uuid} passed its identity quote; the "
                "verifier holds V and releases it after the first integrity "
                "quote; the node holds U and the sealed payload",
            }
        if args.command == "policy":
            return await _policy_command(tenant, args)
        if args.command == "status":
            return await tenant.status(args.uuid)
        if args.command == "list":
            return {"nodes": await tenant.nodes()}
        if args.command == "revoke":
            return await tenant.revoke(args.uuid, args.detail)
        if args.command == "delete":
            await tenant.delete(args.uuid)
            return {"message": f"node {args.uuid} is no longer attested"}
        return {"events": await tenant.events(args.uuid)}
    finally:
        await tenant.close()


async def _policy_command(tenant: Tenant, args: argparse.Namespace) -> Any:
    kind, command = args.kind, args.policy_command
    if command == "add":
        with open(args.file, encoding="utf-8") as f:
            try:
                document = json.load(f)
            except ValueError as exc:
                raise TenantError(f"{args.file} is not JSON: {exc}")
        signature = None
        if args.signature:
            with open(args.signature, "rb") as f:
                signature = f.read()
        meta = await tenant.add_policy(kind, document, args.name, signature)
        return {
            "message": f"{kind} policy {meta['name']!r} version {meta['version']} "
            f"stored ({meta['entries']} entries, digest {meta['digest'][:16]}...)"
        }
    if command == "list":
        rows = await tenant.policies(kind)
        lines = [
            f"{r['name']}@{r['version']}  {r['entries']} entries  "
            f"{'signed' if r['signed'] else 'unsigned'}  {r['digest'][:16]}..."
            for r in rows
        ]
        return {"message": "\n".join(lines) or f"no {kind} policies"}
    if command == "show":
        return {"message": json.dumps(await tenant.policy(kind, args.ref), indent=2)}
    await tenant.delete_policy(kind, args.ref)
    return {"message": f"{kind} policy {args.ref!r} deleted"}


def _print(result: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
    elif "message" in result:
        print(result["message"])
    elif "nodes" in result:
        for node in result["nodes"]:
            print(_describe(node))
    elif "events" in result:
        for item in result["events"]:
            ev = item["signed_event"]["event"]
            print(
                f"{ev['created_at']} node {ev['node_uuid']} revoked: "
                f"{ev['reason']} (delivered: {item['delivered']})"
            )
    else:
        print(_describe(result))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        _print(asyncio.run(_run(args)), args.json)
    except (TenantError, MalformedError, OSError) as exc:
        print(f"trusted-tenant: error: {exc}", file=sys.stderr)
        return 1
    return 0
