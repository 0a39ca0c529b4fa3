#!/usr/bin/env python3
"""Measured-boot policy generation from a disk image (issue 32, "Speed").

Times ``measured_boot_from_image`` (what ``trusted-tenant policy generate
measured-boot --image`` runs): GPT, FAT, ext4 and GRUB's configuration
read in pure Python, shim, GRUB and each kernel's Authenticode digest,
each initrd's sha256, the OVMF variable store's keys. Without ``--image``
it builds a disk with the real tools (sgdisk, mkfs.vfat + mtools,
mke2fs -d) holding a kernel and an initrd of realistic sizes (8 MiB,
36 MiB of random bytes) and times it raw, as qcow2 and as compressed
qcow2.

    .venv/bin/python tools/bench/mb_image_policy.py [--image FILE] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from nova_plugin.imagepolicy import measured_boot_from_image  # noqa: E402
from trusted_testing import bootimage  # noqa: E402

_VARS = "/usr/share/OVMF/OVMF_VARS_4M.ms.fd"


def _time(path: str, rounds: int) -> None:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        document = measured_boot_from_image(path, _VARS)
        best = min(best, time.perf_counter() - started)
    size = os.path.getsize(path) / (1 << 20)
    print(
        f"{os.path.basename(path):<24} {size:>8.1f} MiB  {best * 1000:>8.1f} ms  "
        f"({len(document['kernels'])} kernels, {len(document['initrds'])} initrds)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", help="time this image only")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{'image':<24} {'file':>12}  {'best of ' + str(args.rounds):>11}")
    if args.image:
        _time(args.image, args.rounds)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        shim, grub = bootimage.debian_signed_chain() or (
            bootimage.synthetic_pe(b"shim"),
            bootimage.synthetic_pe(b"grub"),
        )
        version = "6.1.0-18-amd64"
        esp = {
            "EFI/debian/shimx64.efi": shim,
            "EFI/debian/grubx64.efi": grub,
            "EFI/debian/grub.cfg": bootimage.debian_esp_cfg().encode(),
        }
        root = {
            f"boot/vmlinuz-{version}": bootimage.synthetic_pe(os.urandom(8 << 20)),
            f"boot/initrd.img-{version}": os.urandom(36 << 20),
            "boot/grub/grub.cfg": bootimage.debian_grub_cfg(version).encode(),
        }
        raw = os.path.join(tmp, "disk.raw")
        bootimage.build_disk(raw, esp, root, root_mb=96)
        plain, packed = (
            os.path.join(tmp, "disk.qcow2"),
            os.path.join(tmp, "disk-c.qcow2"),
        )
        bootimage.qcow2(raw, plain)
        bootimage.qcow2(raw, packed, compress=True)
        for path in (raw, plain, packed):
            _time(path, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
