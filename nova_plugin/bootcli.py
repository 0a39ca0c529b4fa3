"""Arguments and the run of a trusted boot, shared by both front ends:
``trusted-nova boot`` (:mod:`nova_plugin.nova_cmd`) and ``openstack trusted
server create`` (:mod:`nova_plugin.osc`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any, TypeAlias

from nova_plugin.boot import BootResult, ServerSpec, TrustedBoot
from nova_plugin.cliargs import (
    SETTINGS_ENV,
    attestation_mode,
    certificate_tenant,
    missing_settings,
    pcr_policy,
)
from nova_plugin.exceptions import UsageError
from nova_plugin.tenant import Tenant
from nova_plugin.tenant_auth import keystone_tenant
from verifier.protocol import PcrPolicy
from verifier.protocol.attestation import AttestationMode

__all__ = ["add_boot_arguments", "load_policy", "run_boot", "summary"]

NOVA_API_VERSION = "2.1"
Group: TypeAlias = "argparse._ArgumentGroup"
_SETTING_HELP = {
    "registrar": "registrar base URL; also written into the guest's "
    "bootstrap configuration",
    "verifier": "verifier base URL over mTLS (unset: the catalog's "
    "attestation service on your Keystone session, and no tenant "
    "certificate is needed)",
    "cert": "tenant client certificate (PEM) for mTLS (the noauth demo's "
    "tenant identity; not needed on a Keystone session)",
    "key": "private key of --cert (PEM)",
    "ca": "operator CA bundle (PEM); also given to the guest",
}


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    return key, value


def add_boot_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a trusted boot (Nova's and ours), each with help."""
    nova = p.add_argument_group("server (as for nova boot)")
    _server_arguments(nova)
    _count_arguments(nova)
    ours = p.add_argument_group("trusted boot")
    _policy_arguments(ours)
    _bootstrap_arguments(ours)
    _setting_arguments(ours)


def _server_arguments(nova: Group) -> None:
    """What the server is made of and attached to, as ``nova boot`` takes
    it."""
    nova.add_argument("name", metavar="<name>", help="name of the new server(s)")
    nova.add_argument(
        "--flavor", required=True, metavar="<flavor>", help="flavor name or ID"
    )
    nova.add_argument(
        "--image", required=True, metavar="<image>", help="image ID (as Nova takes it)"
    )
    nova.add_argument("--key-name", metavar="<key-name>", help="keypair to inject")
    nova.add_argument(
        "--availability-zone", metavar="<zone>", help="availability zone to boot in"
    )
    nova.add_argument(
        "--security-groups",
        metavar="<groups>",
        help="comma-separated security group names",
    )
    nova.add_argument(
        "--nic",
        action="append",
        default=[],
        metavar="<net-id=ID,v4-fixed-ip=IP,port-id=ID|auto|none>",
        help="network to attach (repeatable); 'auto' or 'none' alone "
        "(microversion 2.37 or later)",
    )
    nova.add_argument(
        "--meta",
        action="append",
        default=[],
        type=_key_value,
        metavar="<key=value>",
        help="server metadata (repeatable)",
    )


def _count_arguments(nova: Group) -> None:
    """How many servers, and their config drive."""
    nova.add_argument(
        "--min-count",
        type=int,
        default=1,
        metavar="<n>",
        help="boot at least n servers in one request (each is enrolled)",
    )
    nova.add_argument(
        "--max-count",
        type=int,
        metavar="<n>",
        help="boot at most n servers (default: --min-count)",
    )
    nova.add_argument(
        "--config-drive",
        action="store_true",
        help="give the guest a config drive (user-data readable without the "
        "metadata service)",
    )


def _policy_arguments(ours: Group) -> None:
    """The payload and the policies its nodes are judged by."""
    ours.add_argument(
        "--payload",
        required=True,
        metavar="<file>",
        help="the secret payload: sealed under a fresh key before Nova sees "
        "it; a script starting with #! is run in the guest once attested",
    )
    ours.add_argument(
        "--trust-policy",
        metavar="<file>",
        help='JSON PCR policy the verifier enforces ({"pcrs": {"16": ["<hex>"]}})',
    )
    ours.add_argument(
        "--pcr",
        action="append",
        default=[],
        metavar="<N=HEX>",
        help="allowed sha256 value of PCR N (repeatable; instead of --trust-policy)",
    )
    ours.add_argument(
        "--runtime-policy",
        metavar="<name>",
        help="a runtime (IMA) policy stored with the verifier ('trusted-tenant "
        "policy add'): every quote's IMA list is checked against it",
    )
    ours.add_argument(
        "--mb-policy",
        metavar="<name>",
        help="a measured-boot policy stored with the verifier ('trusted-tenant "
        "policy add --kind measured-boot'): every quote's boot event log is checked",
    )


def _bootstrap_arguments(ours: Group) -> None:
    """How the nodes are attested and the bootstrap driven."""
    ours.add_argument(
        "--mode",
        choices=tuple(AttestationMode),
        type=attestation_mode,
        default=AttestationMode.PULL,
        help="how the verifier attests the server(s): pull (it polls the "
        "agent) or push (the agent, configured for push in the image, posts "
        "its evidence and opens no port). Either way --wait reaches the "
        "agent only through the verifier's relay. Default pull",
    )
    ours.add_argument(
        "--push-url",
        default=os.environ.get("TRUSTED_PUSH_URL"),
        metavar="<url>",
        help="with --mode push: the verifier's push endpoint, written into "
        "the guest's bootstrap configuration so that its agent pushes there "
        "(default: $TRUSTED_PUSH_URL; unset: the image or the provider's "
        "vendor-data must configure it)",
    )
    ours.add_argument(
        "--direct-agents",
        action="store_true",
        help="with --wait, reach polled agents directly with --cert/--key "
        "(which they must accept) instead of through the verifier's relay",
    )
    ours.add_argument(
        "--wait",
        action="store_true",
        help="drive the bootstrap: wait for each agent to register, check "
        "its identity quote, send it U and wait until the verifier attested "
        "it, showing progress",
    )
    ours.add_argument(
        "--wait-timeout",
        type=float,
        default=600.0,
        metavar="<seconds>",
        help="give up --wait after this long (default 600); what was made is undone",
    )
    ours.add_argument(
        "--quiet", action="store_true", help="no progress lines on stderr"
    )


def _setting_arguments(ours: Group) -> None:
    """The connection settings (each defaulting to its ``TRUSTED_*``
    variable)."""
    for name, env in SETTINGS_ENV.items():
        ours.add_argument(
            f"--{name}",
            default=os.environ.get(env),
            metavar="<url>" if name in ("registrar", "verifier") else "<file>",
            help=f"{_SETTING_HELP[name]} (default: ${env})",
        )


def load_policy(args: argparse.Namespace) -> PcrPolicy:
    """The PCR policy from --trust-policy or --pcr (empty when only stored
    policies are named).

    Raises:
        UsageError: missing, unreadable or invalid (names the option, the
            file and, for JSON errors, the position).
    """
    stored = getattr(args, "runtime_policy", None) or getattr(args, "mb_policy", None)
    return pcr_policy(
        args.trust_policy,
        args.pcr,
        file_option="--trust-policy",
        stored=bool(stored),
        missing="give --trust-policy FILE or --pcr N=HEX (or a stored "
        "--runtime-policy or --mb-policy)",
        invalid_pcr="invalid --pcr",
    )


def _nics(items: list[str]) -> Any:
    if items in (["auto"], ["none"]):
        return items[0]
    nics = []
    for item in items:
        nic: dict[str, str] = {}
        for pair in item.split(","):
            k, sep, v = pair.partition("=")
            if not sep:
                raise UsageError(f"--nic {item!r}: expected key=value pairs")
            nic[k] = v
        nics.append(nic)
    return nics or None


def _spec(args: argparse.Namespace) -> ServerSpec:
    if args.min_count < 1 or (args.max_count or args.min_count) < args.min_count:
        raise UsageError("--min-count must be >= 1 and <= --max-count")
    return ServerSpec(
        name=args.name,
        image=args.image,
        flavor=args.flavor,
        min_count=args.min_count,
        max_count=args.max_count,
        key_name=args.key_name,
        availability_zone=args.availability_zone,
        security_groups=tuple(g for g in (args.security_groups or "").split(",") if g),
        nics=_nics(args.nic),
        meta=dict(args.meta),
        config_drive=args.config_drive,
    )


def _read(option: str, path: str, mode: str) -> Any:
    """The content of ``path``. Raises: UsageError naming ``option``."""
    try:
        with open(path, mode) as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else exc.reason
        raise UsageError(f"{option} {path}: {reason or exc}") from None


def _progress(quiet: bool) -> Any:
    start = time.monotonic()

    def show(line: str) -> None:
        if not quiet:
            print(f"[{time.monotonic() - start:6.1f}s] {line}", file=sys.stderr)

    return show


def run_boot(args: argparse.Namespace, nova: Any) -> BootResult:
    """Check the input, then boot through ``nova`` (a novaclient Client).

    Raises:
        TenantError: with the message for the user (see
            :class:`nova_plugin.boot.BootFailedError` for what is left).
    """
    session = getattr(getattr(nova, "client", None), "session", None)
    keystone = session is not None and not args.verifier
    optional = ("verifier", "cert", "key") if keystone else ()
    missing = [n for n in SETTINGS_ENV if not getattr(args, n) and n not in optional]
    if missing:
        raise missing_settings(missing)
    policy = load_policy(args)
    spec = _spec(args)
    payload = _read("--payload", args.payload, "rb")
    ca_pem = _read("--ca (or $TRUSTED_CA)", args.ca, "r")
    registrar_url = args.registrar.rstrip("/")

    def tenant_of() -> Tenant:
        if keystone:  # the user's token for the verifier and the registrar
            return keystone_tenant(session, registrar_url, None, args.ca)
        return certificate_tenant(args, args.direct_agents)

    async def go() -> BootResult:
        tenant = tenant_of()
        try:
            boot = TrustedBoot(
                nova,
                tenant,
                policy,
                registrar_url,
                ca_pem,
                _progress(args.quiet),
                mode=args.mode,
                push_url=args.push_url,
                stored=(args.runtime_policy, args.mb_policy),
            )
            return await boot.boot(spec, payload, args.wait, args.wait_timeout)
        finally:
            await tenant.close()

    return asyncio.run(go())


def summary(result: BootResult, waited: bool) -> list[dict[str, Any]]:
    """One row per server for the front ends to print."""
    what = (
        "attested; payload delivered"
        if waited
        else "enrolled; not bootstrapped (U is sent only with --wait)"
    )
    return [
        {"id": s.id, "name": s.name, "trusted": what, "boot_id": result.boot_id}
        for s in result.servers
    ]
