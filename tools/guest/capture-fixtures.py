#!/usr/bin/env python3
"""Regenerate the real-log test fixtures from the measured guest.

Boots the guest (qemu + OVMF + swtpm, see trusted_testing/guest.py), reads
a TPM2 quote of PCRs 0-10 made in the guest by tpm2-tools with an
attestation key created there at boot, its measured-boot event log, both IMA
measurement lists and PCRs 0-10 of all four banks into ``good/``,
then tampers with it (appends a line to the measured script /w/bin/tool.sh
and runs it, then runs a copy of busybox dropped on the writable disk as
/w/bin/uname, then reads a new file while it is open for writing, which IMA
logs as a violation) and reads everything again into ``tampered/``. ``capture.json``
records what produced them.

Usage: .venv/bin/python tools/guest/capture-fixtures.py [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from trusted_testing.guest import CMDLINE, Guest  # noqa: E402
from trusted_testing.guest_capture import package_version  # noqa: E402

DEFAULT_OUT = os.path.join(
    os.path.dirname(os.path.dirname(HERE)), "trusted_testing", "fixtures", "guest"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", default=DEFAULT_OUT, help="fixture directory (default: %(default)s)"
    )
    args = parser.parse_args()
    started = time.monotonic()
    with Guest() as guest:
        assert guest.image is not None
        good = guest.capture(nonce=os.urandom(32))
        failures = guest.tamper()
        tampered = guest.capture(nonce=os.urandom(32))
        kernel = guest.image.kernel_version
    for name in ("good", "tampered"):
        shutil.rmtree(os.path.join(args.out, name), ignore_errors=True)
    good.save(os.path.join(args.out, "good"))
    tampered.save(os.path.join(args.out, "tampered"))
    meta = {
        "captured": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "kernel": kernel,
        "cmdline": CMDLINE,
        "ovmf": package_version("ovmf"),
        "qemu": package_version("qemu-system-x86"),
        "swtpm": package_version("swtpm"),
        "expected_failures": failures,
    }
    with open(os.path.join(args.out, "capture.json"), "w", encoding="ascii") as handle:
        json.dump(meta, handle, indent=1, sort_keys=True)
        handle.write("\n")
    total = 0
    for root, _dirs, files in os.walk(args.out):
        for name in files:
            total += os.path.getsize(os.path.join(root, name))
    print(
        f"fixtures in {args.out}: {total} bytes, "
        f"captured in {time.monotonic() - started:.1f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
