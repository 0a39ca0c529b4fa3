#!/usr/bin/env python3
"""How long the measured guest takes: boot to shell, one full read, tamper.

Boots the measured guest (qemu TCG + OVMF + swtpm, see
trusted_testing/guest.py) N times and prints the medians of:

* boot: qemu start to the guest's shell (OVMF, kernel, init, AK creation);
* capture: one quote of PCRs 0-10 plus the event log, both IMA lists and
  PCRs 0-10 of four banks read over the serial console;
* tamper: the three tamper steps;
* verify: on the host, parse and replay both logs, verify the quote.

The image build (first run only, ~40 s) is not counted.

    .venv/bin/python tools/bench/guest.py [--boots 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from trusted_testing.guest import Capture, Guest  # noqa: E402
from trusted_testing.guest_image import build  # noqa: E402
from verifier.protocol import ima, mb  # noqa: E402
from verifier.protocol.policy import PcrPolicy  # noqa: E402
from verifier.protocol.quote import AttestationKey, Quote, verify_quote  # noqa: E402
from verifier.protocol.tpm import TpmPublic  # noqa: E402


def _verify(capture: Capture) -> None:
    boot = mb.replay(mb.parse(capture.bios_log).events, banks=("sha256",))["sha256"]
    values = {i: boot.get(i, bytes(32)) for i in range(10)}
    values[10] = ima.replay(
        ima.ReplayState(), ima.parse_binary(capture.ima_binary)
    ).sha256
    ak = AttestationKey(TpmPublic.from_bytes(capture.ak_public), activated=True)
    verify_quote(
        Quote(capture.attest, capture.signature, values),
        ak=ak,
        qualifying_data=capture.nonce,
        policy=PcrPolicy({i: frozenset({v}) for i, v in values.items()}),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--boots", type=int, default=3, help="guests to boot")
    args = parser.parse_args()
    image = build()
    times: dict[str, list[float]] = {
        "boot": [],
        "capture": [],
        "tamper": [],
        "verify": [],
    }
    for _ in range(args.boots):
        with Guest(image) as guest:
            times["boot"].append(guest.boot_seconds)
            start = time.perf_counter()
            capture = guest.capture(nonce=os.urandom(32))
            times["capture"].append(time.perf_counter() - start)
            start = time.perf_counter()
            guest.tamper()
            times["tamper"].append(time.perf_counter() - start)
        start = time.perf_counter()
        _verify(capture)
        times["verify"].append(time.perf_counter() - start)
    load = os.getloadavg()[0]
    print(f"measured guest, {args.boots} boots (load average {load:.1f}), medians:")
    for name, values in times.items():
        print(f"  {name:8s} {statistics.median(values):8.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
