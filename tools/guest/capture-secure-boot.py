#!/usr/bin/env python3
"""Regenerate the Secure Boot fixtures (``trusted_testing/fixtures/secure-boot``)
from a real boot.

Builds (or takes from the cache) the Secure Boot disk of the operator's
guest image (:mod:`trusted_testing.guest_sb`), boots it under OVMF's
Secure Boot build with Microsoft's keys and a swtpm vTPM, reads the
firmware event log through the qemu guest agent, and writes:

* ``binary_bios_measurements``: the log as the kernel exposes it;
* ``policy.json``: the measured-boot policy of that image: the chain
  computed from the files the build put in
  (:func:`trusted_testing.guest_sb.reference_policy`) plus the PK, KEK, db
  and dbx the firmware logged and the authorities (the db certificates
  for shim, shim's vendor certificate for GRUB and the kernel);
* ``capture.json``: what produced them (package versions, date).

Usage: .venv/bin/python tools/guest/capture-secure-boot.py [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

from trusted_testing.guest_sb import (  # noqa: E402
    SECURE_BOOT,
    build_secure_boot,
    reference_policy,
)
from trusted_testing.guest_vm_boot import CLOUD_INIT_DONE, VmGuest  # noqa: E402
from trusted_testing.guest_vm_story import MB_LOG  # noqa: E402
from verifier.protocol.mb import efisig, parse  # noqa: E402
from verifier.protocol.mb.chain import DATABASES  # noqa: E402
from verifier.protocol.mb.eventlog import (  # noqa: E402
    EV_EFI_VARIABLE_DRIVER_CONFIG,
    parse_efi_variable,
)
from verifier.protocol.mb.shim import shim_builtins  # noqa: E402

OUT = os.path.join(ROOT, "trusted_testing", "fixtures", "secure-boot")


def _version(package: str) -> str:
    done = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", package],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "not installed"


def logged_databases(raw: bytes) -> dict[str, list[str]]:
    """The entries of PK, KEK, db and dbx as the firmware logged them."""
    out: dict[str, list[str]] = {}
    for event in parse(raw).events:
        if event.event_type != EV_EFI_VARIABLE_DRIVER_CONFIG:
            continue
        var = parse_efi_variable(event.data)
        for key, (name, guid) in DATABASES.items():
            if var.name == name and str(var.guid) == guid:
                entries = efisig.parse_signature_lists(var.data, name)
                out[key] = sorted({entry.key for entry in entries})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args()
    sb = build_secure_boot()
    guest = VmGuest(sb.image, "#cloud-config\n{}\n", firmware=SECURE_BOOT)
    with guest:
        guest.wait_for(CLOUD_INIT_DONE, 900.0, "cloud-init")
        guest.agent.wait_ready(300.0)
        raw = guest.agent.read_file(MB_LOG)
    policy = reference_policy(sb)
    policy.update(logged_databases(raw))
    with open(sb.shim, "rb") as handle:
        vendor = shim_builtins(handle.read()).vendor_cert or b""
    policy["authorities"] = [
        {"variable": "db", "entry": key}
        for key in policy["db"]
        if key.startswith("x509:")
    ] + [
        {"variable": "MokListRT", "entry": "x509:" + hashlib.sha256(vendor).hexdigest()}
    ]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "binary_bios_measurements"), "wb") as handle:
        handle.write(raw)
    with open(os.path.join(args.out, "policy.json"), "w", encoding="utf-8") as out:
        json.dump(policy, out, indent=1, sort_keys=True)
        out.write("\n")
    capture = {
        "what": "the firmware event log of trusted_testing.guest_sb's whole disk "
        "booted under OVMF Secure Boot (Microsoft keys) with a swtpm vTPM, and "
        "the measured-boot policy of that image",
        "captured": datetime.date.today().isoformat(),
        "command": "tools/guest/capture-secure-boot.py",
        "ovmf": _version("ovmf") + " (OVMF_CODE_4M.ms.fd, OVMF_VARS_4M.ms.fd)",
        "qemu-system-x86": _version("qemu-system-x86"),
        "swtpm": _version("swtpm"),
        "boot loaders": sb.versions,
        "kernel": sb.kernel,
        "initrd": sb.initrd,
        "kernel_cmdline": sb.grub_kernel_cmdline,
    }
    with open(os.path.join(args.out, "capture.json"), "w", encoding="utf-8") as out:
        json.dump(capture, out, indent=1, sort_keys=True)
        out.write("\n")
    print(f"wrote {args.out}: {len(parse(raw).events)} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
