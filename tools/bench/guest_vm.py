#!/usr/bin/env python3
"""The trusted boot of a real guest, timed (a benchmark, not a test).

Boots the operator's image (``elements/trusted-agent``; qemu TCG + OVMF +
a swtpm vTPM with an EK certificate + a NoCloud seed) ``--boots`` times,
each time through the tenant's trusted boot (policies built from the
image), and prints the medians of:

* seconds after qemu started: cloud-init done, agent registered,
  attested, payload ran;
* the agent inside the guest: its resident memory and its CPU time per
  verified quote (``/proc/PID/status`` and ``/proc/PID/stat`` read through
  the qemu guest agent, over ``--window`` seconds of steady attestation);
* IMA entries: the first quote's (the whole list since boot) and those
  per quote after it.

With ``--secure-boot``, each boot is done twice, once per image: the
direct kernel boot above, and the same root file system as a whole disk
booted by OVMF's Secure Boot build through shim and GRUB
(:mod:`trusted_testing.guest_sb`), enrolled with its Secure Boot chain
policy; the medians of both and their ratio are printed side by side.

    .venv/bin/python tools/bench/guest_vm.py [--boots 3] [--interval 2]
        [--secure-boot]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from trusted_testing.guest_sb import (  # noqa: E402
    SECURE_BOOT,
    build_secure_boot,
    reference_policy,
)
from trusted_testing.guest_vm import build  # noqa: E402
from trusted_testing.guest_vm_story import StoryNode, VmCluster  # noqa: E402
from trusted_testing.qga import GuestAgent  # noqa: E402

STAGES = ("cloud-init done", "agent registered", "attested", "payload ran")
PAYLOAD = b"#!/bin/sh\necho hello from the payload\n"
_TICKS = os.sysconf("SC_CLK_TCK")


def agent_usage(agent: GuestAgent) -> tuple[int, float]:
    """(resident KiB, CPU seconds so far) of trusted-agent in the guest."""
    pid = agent.exec(["/usr/bin/systemctl", "show", "-P", "MainPID", "trusted-agent"])
    number = pid.text.strip()
    status = agent.read_file(f"/proc/{number}/status").decode()
    rss = next(
        int(line.split()[1])
        for line in status.splitlines()
        if line.startswith("VmRSS:")
    )
    stat = agent.read_file(f"/proc/{number}/stat").decode()
    fields = stat.rsplit(")", 1)[1].split()
    return rss, (int(fields[11]) + int(fields[12])) / _TICKS


def one_boot(
    workdir: str, interval: float, window: float, secure_boot: bool = False
) -> dict[str, float]:
    """One boot's figures (see the module doc)."""
    cluster = VmCluster(workdir, interval)
    node = None
    try:
        cluster.prepare()
        if secure_boot:
            sb = build_secure_boot(build())
            node = StoryNode.boot(
                cluster,
                sb.image,
                str(uuid.uuid4()),
                PAYLOAD,
                firmware=SECURE_BOOT,
                mb_policy=reference_policy(sb),
            )
        else:
            node = StoryNode.boot(cluster, build(), str(uuid.uuid4()), PAYLOAD)
        node.bootstrap(900.0)
        first = cluster.node_status(node.uuid) or {}
        rss0, cpu0 = agent_usage(node.guest.agent)
        time.sleep(window)
        rss1, cpu1 = agent_usage(node.guest.agent)
        last = cluster.node_status(node.uuid) or {}
        quotes = max(1, last["quotes_verified"] - first["quotes_verified"])
        figures = {stage: node.marks[stage] for stage in STAGES}
        figures["agent RSS MiB"] = max(rss0, rss1) / 1024
        figures["agent CPU ms per quote"] = 1000 * (cpu1 - cpu0) / quotes
        figures["IMA entries, first quote"] = float(first["ima_entries"])
        figures["IMA entries per later quote"] = (
            last["ima_entries"] - first["ima_entries"]
        ) / quotes
        return figures
    finally:
        if node is not None:
            node.guest.stop()
        cluster.stop()


def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(run[k] for run in runs) for k in runs[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--boots", type=int, default=3)
    parser.add_argument("--interval", type=float, default=2.0, help="quote interval")
    parser.add_argument("--window", type=float, default=30.0, help="steady seconds")
    parser.add_argument(
        "--secure-boot",
        action="store_true",
        help="also boot the Secure Boot disk each time and compare",
    )
    args = parser.parse_args()
    kinds = ("direct", "secure boot") if args.secure_boot else ("direct",)
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="bench-guest-vm-") as tmp:
        for index in range(args.boots):
            for kind in kinds:
                figures = one_boot(
                    os.path.join(tmp, f"boot{index}-{kind.replace(' ', '-')}"),
                    args.interval,
                    args.window,
                    secure_boot=kind == "secure boot",
                )
                runs[kind].append(figures)
                shown = ", ".join(f"{k} {v:.1f}" for k, v in figures.items())
                print(f"boot {index + 1} ({kind}): {shown}", flush=True)
    medians = {kind: _medians(found) for kind, found in runs.items()}
    print(f"\nmedians over {args.boots} boots (qemu TCG, 1 vCPU, 1 GiB):")
    print(f"  {'':32s} " + " ".join(f"{kind:>12s}" for kind in kinds))
    for key in medians["direct"]:
        unit = "  s after qemu started" if key in STAGES else ""
        values = " ".join(f"{medians[kind][key]:12.1f}" for kind in kinds)
        ratio = ""
        if args.secure_boot and medians["direct"][key]:
            ratio = f"  x{medians['secure boot'][key] / medians['direct'][key]:.2f}"
        print(f"  {key:32s} {values}{ratio}{unit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
