"""``trusted-tenant seal`` and ``send-sealed``: a payload sealed to a
policy over attested node attributes (CP-ABE under the verifier's public
parameters, :mod:`nova_plugin.policy_seal`), and handed to a node to open.

``seal`` needs the ``abe`` extra; ``send-sealed`` does not, but calls the
node's agent's own API, so it needs the tenant certificate.
"""

from __future__ import annotations

import argparse
from typing import Any

from nova_plugin.commands.base import TenantCommand
from nova_plugin.policy_seal import (
    fetch_params,
    seal_to_policy,
    sealed_policy,
    send_sealed,
)
from nova_plugin.tenant import Tenant

__all__ = ["Seal", "SendSealed"]


class Seal(TenantCommand):
    name = "seal"
    help = (
        "seal a payload to a policy over attested node attributes "
        "(CP-ABE under the verifier's public parameters)"
    )
    extra = "abe"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--seal-policy",
            required=True,
            help="e.g. 'region=eu and (hv=kvm-9 or hv=xen-4.5)'; "
            "also: 2 of (a, b, c); attributes are name=value",
        )
        parser.add_argument("--payload", required=True, help="file to seal")
        parser.add_argument(
            "--out", required=True, help="where to write the sealed blob"
        )

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
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


class SendSealed(TenantCommand):
    name = "send-sealed"
    help = "hand a policy-sealed blob to a node to open"
    needs_registrar = True
    agent_api = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("uuid")
        parser.add_argument("--blob", required=True, help="output of 'seal'")

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
        with open(args.blob, "rb") as f:
            blob = f.read()
        answer = dict(await send_sealed(tenant, args.uuid, blob))
        answer["message"] = f"node {args.uuid} opened the payload: {answer.get('path')}"
        return answer
