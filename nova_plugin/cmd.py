"""``trusted-tenant``: enrol nodes, watch them, revoke them; check the
verifier's own integrity (``monitor-trust``, ``monitor-attest``); seal a
payload to a policy over attested node attributes (``seal --seal-policy``,
``send-sealed``).

Connection settings come from options or the environment
(``TRUSTED_REGISTRAR_URL``, ``TRUSTED_VERIFIER_URL``, ``TRUSTED_CA``).
With keystoneauth options (``--os-auth-type`` or ``OS_AUTH_TYPE``, and
the usual ``OS_*``) every call goes over the user's Keystone session and
no tenant certificate is needed; without them (the ``noauth`` demo)
``TRUSTED_CERT`` and ``TRUSTED_KEY`` name the tenant's project. Nodes'
agents are reached through the verifier's relay in both cases
(``--direct-agents`` keeps the older direct path to polled agents).

``seal`` needs the ``abe`` extra (``pip install 'trusted-cloud[abe]'``);
without it the command says so in one line and exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import ssl
import sys
from collections.abc import Mapping
from typing import Any

from keystoneauth1 import exceptions as ks_exc
from keystoneauth1 import loading as ks_loading

from nova_plugin.cliargs import SETTINGS_ENV, missing_settings, pcr_policy
from nova_plugin.exceptions import TenantError, UsageError
from nova_plugin.monitor import load_pinned_ak, monitor_attest, trust_monitor_ak
from nova_plugin.policy_seal import (
    fetch_params,
    seal_to_policy,
    sealed_policy,
    send_sealed,
)
from nova_plugin.policygen import add_generate_parser, generate
from nova_plugin.tenant import Tenant, TenantConfig
from nova_plugin.tenant_auth import keystone_tenant
from verifier.common import extras, version
from verifier.protocol import MalformedError, PcrPolicy, TpmPublic, jsonlimits
from verifier.protocol.messages.enrolment import check_interval


def _interval(text: str) -> float:
    """``--interval``: a number of seconds the verifier can accept."""
    try:
        value = check_interval("--interval", float(text))
    except (ValueError, MalformedError) as exc:
        raise argparse.ArgumentTypeError(
            str(exc) if isinstance(exc, MalformedError) else f"not a number: {text!r}"
        ) from None
    assert value is not None
    return value


def _pcr_options(parser: argparse.ArgumentParser, whose: str) -> None:
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


def _parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trusted-tenant",
        description="Enrol nodes with an encrypted payload, check their "
        "attestation status, and revoke them; seal payloads to a policy over "
        "attested node attributes; check the verifier's own integrity.",
    )
    for name, env in SETTINGS_ENV.items():
        p.add_argument(
            f"--{name}", default=os.environ.get(env), help=f"(default: ${env})"
        )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--direct-agents",
        action="store_true",
        help="reach polled nodes' agents directly with --cert/--key (which "
        "the agents must accept) instead of through the verifier's relay",
    )
    ks_loading.register_session_argparse_arguments(p)
    ks_loading.register_auth_argparse_arguments(
        p, list(argv if argv is not None else sys.argv[1:]), default=None
    )
    sub = p.add_subparsers(dest="command", required=True)
    enrol = sub.add_parser("enrol", help="enrol a node with a payload and a policy")
    enrol.add_argument("uuid", help="the node's UUID")
    enrol.add_argument(
        "--payload",
        required=True,
        help="file to deliver; a script starting with #! is run",
    )
    _pcr_options(enrol, "of the node")
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
    enrol.add_argument(
        "--mode",
        choices=("pull", "push"),
        default="pull",
        help="how the verifier attests the node: pull (default; it polls the "
        "agent) or push (the agent posts evidence to the verifier's push "
        "endpoint and opens no port: for nodes nobody can reach; the identity "
        "quote and U then go through the verifier's relay)",
    )
    enrol.add_argument(
        "--interval",
        type=_interval,
        metavar="SECONDS",
        help="the node's own seconds between integrity quotes, its "
        "verification class (pull nodes; default: the verifier's "
        "quote_interval; the verifier may refuse intervals shorter than its "
        "min_node_interval)",
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
    add_generate_parser(pol_sub)
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
    seal = sub.add_parser(
        "seal",
        help="seal a payload to a policy over attested node attributes "
        "(CP-ABE under the verifier's public parameters)",
    )
    seal.add_argument(
        "--seal-policy",
        required=True,
        help="e.g. 'region=eu and (hv=kvm-9 or hv=xen-4.5)'; "
        "also: 2 of (a, b, c); attributes are name=value",
    )
    seal.add_argument("--payload", required=True, help="file to seal")
    seal.add_argument("--out", required=True, help="where to write the sealed blob")
    send = sub.add_parser(
        "send-sealed", help="hand a policy-sealed blob to a node to open"
    )
    send.add_argument("uuid")
    send.add_argument("--blob", required=True, help="output of 'seal'")
    trust = sub.add_parser(
        "monitor-trust",
        help="check the verifier host's EK certificate, prove its AK is in "
        "the same TPM (credential activation) and pin that AK to a file",
    )
    trust.add_argument("--ek-ca", required=True, help="TPM vendor CA bundle (PEM)")
    trust.add_argument("--out", required=True, help="file to write the pinned AK to")
    attest = sub.add_parser(
        "monitor-attest",
        help="ask the verifier to prove its own integrity (a TPM quote over "
        "a fresh nonce, batched with other customers' nonces)",
    )
    attest.add_argument("--ak", required=True, help="pinned AK (monitor-trust --out)")
    _pcr_options(attest, "of the verifier host")
    events = sub.add_parser("events", help="show revocation events")
    events.add_argument("uuid", nargs="?")
    return p


def _readable(option: str, path: str) -> None:
    """Raises: UsageError naming ``option`` and ``path`` if it cannot be read."""
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror or exc}") from None


def _policy(args: argparse.Namespace) -> PcrPolicy:
    """The PCR policy of ``enrol`` or ``monitor-attest``.

    Raises:
        UsageError: none given, or an unreadable or invalid one.
    """
    stored = getattr(args, "runtime_policy", None) or getattr(args, "mb_policy", None)
    return pcr_policy(
        args.policy,
        args.pcr,
        file_option="--policy",
        stored=bool(stored),
        missing="give --pcr N=HEX, --policy FILE, --runtime-policy or --mb-policy"
        if args.command == "enrol"
        else "give --pcr N=HEX or --policy FILE",
    )


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
    if node.get("ima_entries") is not None:
        line += f"\n    IMA entries verified: {node['ima_entries']}"
    if node.get("failure_reason"):
        line += f"\n    reason: {node['failure_reason']}"
    return line


async def _monitor(tenant: Tenant, args: argparse.Namespace) -> Any:
    if args.command == "monitor-trust":
        with open(args.ek_ca, "rb") as f:
            ak = await trust_monitor_ak(tenant, f.read())
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(base64.b64encode(ak).decode() + "\n")
        name = TpmPublic.from_bytes(ak).name.hex()
        return {
            "ak_name": name,
            "message": f"verifier AK {name} activated against its EK "
            f"certificate; pinned in {args.out}",
        }
    with open(args.ak, encoding="utf-8") as f:
        try:
            pinned = base64.b64decode(f.read().strip(), validate=True)
        except ValueError:
            raise TenantError(f"{args.ak} is not a pinned AK (base64)")
    verdict = await monitor_attest(tenant, load_pinned_ak(pinned), _policy(args))
    return {
        "batch_size": verdict.size,
        "tpm_clock": verdict.clock.to_dict(),
        "pcrs": {str(i): v.hex() for i, v in sorted(verdict.pcr_values.items())},
        "message": "the verifier proved its integrity: its TPM quoted the "
        f"expected PCRs over a batch of {verdict.size} nonce(s) including yours",
    }


async def _sealing(tenant: Tenant, args: argparse.Namespace) -> Any:
    if args.command == "seal":
        with open(args.payload, "rb") as f:
            payload = f.read()
        params = await fetch_params(tenant)
        blob = seal_to_policy(params, args.seal_policy, payload)
        with open(args.out, "wb") as f:
            f.write(blob)
        return {
            "epoch": params.epoch,
            "project": params.project,
            "bytes": len(blob),
            "message": f"sealed {len(payload)} bytes to "
            f"{sealed_policy(params, args.seal_policy)}: {args.out}",
        }
    with open(args.blob, "rb") as f:
        blob = f.read()
    answer = dict(await send_sealed(tenant, args.uuid, blob))
    answer["message"] = f"node {args.uuid} opened the payload: {answer.get('path')}"
    return answer


def _tenant(args: argparse.Namespace) -> Tenant:
    """The tenant client: on a Keystone session when keystoneauth options
    are given (no certificate), else with the ``noauth`` demo's tenant
    certificate.

    Raises:
        UsageError: a missing setting or an unreadable file.
    """
    direct = args.direct_agents or args.command == "send-sealed"  # agent's API
    auth = ks_loading.load_auth_from_argparse_arguments(args)
    needed = ["registrar"] if args.command in ("enrol", "send-sealed") else []
    if auth is None or direct:  # certificates (the noauth demo, or agents)
        needed += ["verifier", "cert", "key", "ca"]
    missing = [n for n in needed if not getattr(args, n)]
    if missing:
        raise missing_settings(missing)
    for name in ("cert", "key", "ca"):
        if getattr(args, name):
            _readable(f"--{name} (or ${SETTINGS_ENV[name]})", getattr(args, name))
    if args.command == "enrol":
        _readable("--payload", args.payload)
        if args.interval is not None and args.mode != "pull":
            raise UsageError("--interval is for pull nodes (--mode pull)")
    if auth is not None and not direct:
        session = ks_loading.load_session_from_argparse_arguments(args, auth=auth)
        return keystone_tenant(
            session,
            (args.registrar or "").rstrip("/"),
            (args.verifier or "").rstrip("/") or None,
            args.ca,
        )
    try:
        return Tenant(
            TenantConfig(
                (args.registrar or "").rstrip("/"),
                args.verifier.rstrip("/"),
                args.cert,
                args.key,
                args.ca,
                direct_agents=direct,
            )
        )
    except ssl.SSLError as exc:
        raise UsageError(
            f"--cert {args.cert}, --key {args.key}, --ca {args.ca}: not a usable "
            f"certificate, key and CA (PEM): {exc}"
        ) from None


async def _run(args: argparse.Namespace) -> Any:
    tenant = _tenant(args)
    try:
        if args.command in ("seal", "send-sealed"):
            return await _sealing(tenant, args)
        if args.command.startswith("monitor-"):
            return await _monitor(tenant, args)
        if args.command == "enrol":
            with open(args.payload, "rb") as f:
                payload = f.read()
            result = await tenant.enrol(
                args.uuid,
                payload,
                _policy(args),
                runtime_policy=args.runtime_policy,
                mb_policy=args.mb_policy,
                mode=args.mode,
                interval=args.interval,
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
    version.exit_if_asked(argv, "trusted-tenant")
    args = _parser(argv).parse_args(argv)
    if args.command == "policy" and args.policy_command == "generate":
        try:  # offline: no verifier, no credentials
            _print(generate(args), args.json)
        except (TenantError, OSError) as exc:
            print(f"trusted-tenant: error: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "seal":
        try:
            extras.require("abe", "trusted-tenant seal")
        except extras.MissingExtraError as exc:
            print(f"trusted-tenant: error: {exc}", file=sys.stderr)
            return 2
    try:
        _print(asyncio.run(_run(args)), args.json)
    except UsageError as exc:
        print(f"trusted-tenant: error: {exc}", file=sys.stderr)
        return 2
    except (TenantError, MalformedError, OSError) as exc:
        print(f"trusted-tenant: error: {exc}", file=sys.stderr)
        return 1
    except ks_exc.ClientException as exc:  # e.g. Keystone unreachable
        print(f"trusted-tenant: error: Keystone: {exc}", file=sys.stderr)
        return 1
    return 0
