#!/usr/bin/env python3
"""Real VMs through Nova 34's own libvirt driver (TCG), with and without
Nova's vTPM: ``POST /servers`` to ACTIVE, and to the guest kernel's first
line on the console, p50 over ``--runs`` boots per flavor, beside the
deployment's bring-up.

Flavors (:mod:`trusted_testing.nova.libvirt_deploy`): ``trusted.plain``
(no vTPM), ``trusted.vtpm`` (``hw:tpm_secret_security=user``) and
``trusted.vtpm-host`` (``host``). The difference between plain and vTPM is
what Nova's vTPM costs at boot: a key from the key manager (castellan on
OpenBao), a libvirt secret, ``swtpm_setup`` with an EK certificate from the
host's swtpm local CA, and swtpm itself.

    .venv/bin/python tools/bench/nova_vm.py [--runs 3] [--marker TEXT]

With ``--trusted``, the whole trusted boot instead, on a deployment with a
guest network (:class:`trusted_testing.nova.story.NovaStory`: registrar,
verifier, listener, the host's CA enrolled): per run, a plain ``POST
/servers`` of the same image, flavor (``trusted.vtpm-host``) and network
to ACTIVE, and ``trusted-nova boot --wait`` to its return (attested, V
released: the payload is delivered) and to the payload's status file in
the guest (read through the guest agent); p50 of each.

Needs root, RabbitMQ, libvirtd/qemu/swtpm and the guest image
(``python -m trusted_testing.guest_vm build``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from trusted_testing.guest_vm import build  # noqa: E402
from trusted_testing.nova.libvirt_deploy import LibvirtNovaDeployment  # noqa: E402

FLAVORS = ("trusted-plain", "trusted-vtpm", "trusted-vtpm-host")


def _wait(predicate: object, timeout: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():  # type: ignore[operator]
            return time.monotonic() - start
        time.sleep(0.2)
    return None


def _console_has(nova: LibvirtNovaDeployment, uuid: str, marker: bytes) -> bool:
    path = os.path.join(nova.workdir, "instances", uuid, "console.log")
    try:
        with open(path, "rb") as f:
            return marker in f.read()
    except OSError:
        return False


def boot_once(
    nova: LibvirtNovaDeployment, image_id: str, flavor: str, marker: bytes
) -> tuple[float, float | None]:
    body = {
        "server": {
            "name": f"bench-{flavor}",
            "imageRef": image_id,
            "flavorRef": flavor,
            "networks": "none",
        }
    }
    start = time.monotonic()
    resp = nova.request("POST", "/servers", json=body, microversion="2.37")
    resp.raise_for_status()
    uuid = resp.json()["server"]["id"]
    try:
        status = ""

        def settled() -> bool:
            nonlocal status
            server = nova.server(uuid) or {}
            status = str(server.get("status"))
            return status in ("ACTIVE", "ERROR")

        if _wait(settled, 600) is None or status != "ACTIVE":
            raise RuntimeError(f"{flavor}: server {uuid} is {status}")
        active = time.monotonic() - start
        seen = _wait(lambda: _console_has(nova, uuid, marker), 300)
        to_marker = None if seen is None else time.monotonic() - start
        return active, to_marker
    finally:
        nova.request("DELETE", f"/servers/{uuid}")
        _wait(lambda: nova.server(uuid) is None, 300)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--marker", default="Linux version")
    parser.add_argument(
        "--trusted",
        action="store_true",
        help="trusted-nova boot --wait to attested and to the payload run, "
        "beside plain create to ACTIVE (tools/bench/nova_story.py)",
    )
    args = parser.parse_args()
    if args.trusted:
        from nova_story import run  # noqa: PLC0415  (beside this file)

        return run(args.runs)
    image = build()
    tmp = tempfile.mkdtemp(prefix="nova-vm-bench-")
    nova = LibvirtNovaDeployment(tmp)
    try:
        nova.start()
        print(f"bring-up (API, Placement, conductor, scheduler, compute host, "
              f"OpenBao): {nova.bring_up_seconds:.1f} s")  # fmt: skip
        image_id = nova.add_guest_image(
            image.qcow2, image.kernel, image.initrd, image.cmdline
        )
        marker = args.marker.encode()
        print(f"p50 over {args.runs} boots each (qemu TCG, 1 vCPU, 512 MiB):")
        for flavor in FLAVORS:
            actives, markers = [], []
            for _ in range(args.runs):
                active, seen = boot_once(nova, image_id, flavor, marker)
                actives.append(active)
                if seen is not None:
                    markers.append(seen)
            line = f"  {flavor:18s} to ACTIVE {statistics.median(actives):6.1f} s"
            if markers:
                line += f"   to {args.marker!r} {statistics.median(markers):6.1f} s"
            print(line + f"   (runs: {', '.join(f'{a:.1f}' for a in actives)})")
    finally:
        nova.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
