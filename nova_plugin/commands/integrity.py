"""``trusted-tenant monitor-trust`` and ``monitor-attest``: the
customer's check of the verifier's own integrity (:mod:`nova_plugin.monitor`):
pin the verifier host's AK once its EK certificate and credential
activation prove it a TPM key, then ask for quotes over fresh nonces.
"""

from __future__ import annotations

import argparse
import base64
from typing import Any

from nova_plugin.commands.base import TenantCommand, add_pcr_options, read_pcr_policy
from nova_plugin.exceptions import TenantError
from nova_plugin.monitor import load_pinned_ak, monitor_attest, trust_monitor_ak
from nova_plugin.tenant import Tenant
from verifier.protocol import TpmPublic

__all__ = ["MonitorAttest", "MonitorTrust"]


class MonitorTrust(TenantCommand):
    name = "monitor-trust"
    help = (
        "check the verifier host's EK certificate, prove its AK is in "
        "the same TPM (credential activation) and pin that AK to a file"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--ek-ca", required=True, help="TPM vendor CA bundle (PEM)")
        parser.add_argument(
            "--out", required=True, help="file to write the pinned AK to"
        )

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
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


class MonitorAttest(TenantCommand):
    name = "monitor-attest"
    help = (
        "ask the verifier to prove its own integrity (a TPM quote over "
        "a fresh nonce, batched with other customers' nonces)"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--ak", required=True, help="pinned AK (monitor-trust --out)"
        )
        add_pcr_options(parser, "of the verifier host")

    async def run(self, tenant: Tenant, args: argparse.Namespace) -> Any:
        with open(args.ak, encoding="utf-8") as f:
            try:
                pinned = base64.b64decode(f.read().strip(), validate=True)
            except ValueError:
                raise TenantError(f"{args.ak} is not a pinned AK (base64)")
        ak = load_pinned_ak(pinned)
        policy = read_pcr_policy(args, missing="give --pcr N=HEX or --policy FILE")
        verdict = await monitor_attest(tenant, ak, policy)
        return {
            "batch_size": verdict.size,
            "tpm_clock": verdict.clock.to_dict(),
            "pcrs": {str(i): v.hex() for i, v in sorted(verdict.pcr_values.items())},
            "message": "the verifier proved its integrity: its TPM quoted the "
            f"expected PCRs over a batch of {verdict.size} nonce(s) including yours",
        }
