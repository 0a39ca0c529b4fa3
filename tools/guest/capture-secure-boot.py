#!/usr/bin/env python3
"""Regenerate the Secure Boot fixtures (``trusted_testing/fixtures/secure-boot``)
from a real boot.

Builds (or takes from the cache) the Secure Boot disk of the operator's
guest image (:mod:`trusted_testing.guest_sb`), boots it under OVMF's
Secure Boot build with Microsoft's keys and a swtpm vTPM, reads the
firmware event log through the qemu guest agent, and writes:

* ``binary_bios_measurements``: the log as the kernel exposes it;
* ``policy.json``: the measured-boot policy generated from that disk and
  the variable store it booted with (``trusted-tenant policy generate
  measured-boot --image DISK --vars OVMF_VARS_4M.ms.fd``), checked to pass
  the log;
* ``capture.json``: what produced them (package versions, date).

Usage: .venv/bin/python tools/guest/capture-secure-boot.py [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

from nova_plugin.imagepolicy import measured_boot_from_image  # noqa: E402
from trusted_testing.guest_capture import package_version  # noqa: E402
from trusted_testing.guest_sb import (  # noqa: E402
    OVMF_VARS_SB,
    SECURE_BOOT,
    build_secure_boot,
)
from trusted_testing.guest_vm_boot import CLOUD_INIT_DONE, VmGuest  # noqa: E402
from trusted_testing.guest_vm_story import MB_LOG  # noqa: E402
from verifier.protocol.mb import MeasuredBootPolicy, evaluate, parse  # noqa: E402

OUT = os.path.join(ROOT, "trusted_testing", "fixtures", "secure-boot")


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
    policy = measured_boot_from_image(sb.disk, OVMF_VARS_SB)
    failures = evaluate(MeasuredBootPolicy.from_dict(policy), parse(raw).events)
    if failures:
        print(f"the image's policy refuses its own boot: {failures}", file=sys.stderr)
        return 1
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
        "ovmf": package_version("ovmf") + " (OVMF_CODE_4M.ms.fd, OVMF_VARS_4M.ms.fd)",
        "qemu-system-x86": package_version("qemu-system-x86"),
        "swtpm": package_version("swtpm"),
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
