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
        raise TenantError("give --pcr N=HEX or --policy FILE")
    return PcrPolicy.from_dict({"pcrs": pcrs})


def _describe(node: Mapping[str, Any]) -> str:
    state = node["state"]
    words = {
        "pending": "enrolled at boot, Nova has not reported the instance created",
        "created": "instance created, waiting for its agent to register",
        "registered": "enrolled, waiting for its first integrity quote",
        "bootstrapping": "passed its first quote, receiving its key share",
        "attested": "trusted: its TPM quotes match the policy",
        "failed": "not answering the verifier",
        "revoked": "REVOKED",
    }.get(state, state)
    line = f"{node['uuid']}: {words} ({node['quotes_verified']} quotes verified)"
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
            result = await tenant.enrol(args.uuid, payload, _policy(args))
            return {
                "uuid": result.uuid,
                "state": result.state,
                "message": f"node {result.uuid} passed its identity quote; the "
                "verifier holds V and releases it after the first integrity "
                "quote; the node holds U and the sealed payload",
            }
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
