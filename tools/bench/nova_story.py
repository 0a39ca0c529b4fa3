#!/usr/bin/env python3
"""``trusted-nova boot --wait`` of a real guest through Nova's own libvirt
driver: to attested (the command returns: V released, payload delivered)
and to the payload's status file in the guest, beside a plain ``POST
/servers`` to ACTIVE of the same image, flavor and network, p50 over the
runs, all on one deployment. Run through ``nova_vm.py --trusted``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from nova_plugin.policygen import PAYLOAD_PATH  # noqa: E402
from trusted_testing.guest_vm import build  # noqa: E402
from trusted_testing.guest_vm_story import image_policies  # noqa: E402
from trusted_testing.nova.cli import run_cli, tenant_argv  # noqa: E402
from trusted_testing.nova.deploy import TENANT_HEADERS  # noqa: E402
from trusted_testing.nova.neutron_standin import NETWORK_ID  # noqa: E402
from trusted_testing.nova.story import NovaStory, seabios_mb_policy  # noqa: E402
from trusted_testing.qga import GuestAgentError  # noqa: E402

FLAVOR = "trusted-vtpm-host"
PAYLOAD = b'#!/bin/sh\necho "payload ran on $TRUSTED_NODE_UUID"\n'


def _wait(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _delete(story: NovaStory, uuid: str) -> None:
    story.nova.request("DELETE", f"/servers/{uuid}")
    _wait(lambda: story.nova.server(uuid) is None, 300, f"{uuid} deleted")


def plain(story: NovaStory) -> float:
    body = {
        "server": {
            "name": "bench-plain",
            "imageRef": story.image_id,
            "flavorRef": FLAVOR,
            "networks": [{"uuid": NETWORK_ID}],
        }
    }
    start = time.monotonic()
    resp = story.nova.request("POST", "/servers", json=body, microversion="2.37")
    resp.raise_for_status()
    uuid = resp.json()["server"]["id"]
    try:
        _wait(
            lambda: (
                (story.nova.server(uuid) or {}).get("status") in ("ACTIVE", "ERROR")
            ),
            600,
            "ACTIVE",
        )
        if (story.nova.server(uuid) or {}).get("status") != "ACTIVE":
            raise RuntimeError(f"plain boot: {story.nova.server(uuid)}")
        return time.monotonic() - start
    finally:
        _delete(story, uuid)


def trusted(story: NovaStory, tmp: str) -> tuple[float, float]:
    payload = os.path.join(tmp, "payload.sh")
    with open(payload, "wb") as f:
        f.write(PAYLOAD)
    headers = []
    for name, value in TENANT_HEADERS.items():
        headers += ["--nova-header", f"{name}:{value}"]
    argv = [
        "boot", "bench-trusted", "--flavor", FLAVOR, "--image", story.image_id,
        "--nic", f"net-id={NETWORK_ID}", "--payload", payload,
        "--runtime-policy", "image", "--mb-policy", "seabios",
        "--wait", "--wait-timeout", "900", "--quiet",
        *tenant_argv(story.cluster.tenant_env(), story.nova.api_url, None),
        "--os-compute-api-version", "2.37", *headers,
    ]  # fmt: skip
    start = time.monotonic()
    code, out, err = run_cli(argv)
    attested = time.monotonic() - start
    if code != 0:
        raise RuntimeError(f"trusted-nova boot: {err}")
    uuid = json.loads(out.splitlines()[0])["id"]
    try:
        agent = story.guest_agent(uuid)

        def ran() -> bool:
            try:
                done = agent.exec(["/bin/cat", PAYLOAD_PATH + ".status"])
            except GuestAgentError:
                return False
            return done.exit_code == 0

        _wait(ran, 300, "the payload's status")
        return attested, time.monotonic() - start
    finally:
        _delete(story, uuid)


def run(runs: int) -> int:
    image = build()
    tmp = tempfile.mkdtemp(prefix="nova-story-bench-")
    story = NovaStory(tmp, 3.0)
    try:
        story.start(image)
        print(f"bring-up (services, Nova, compute host, guest network): "
              f"{story.marks['bring-up']:.1f} s")  # fmt: skip
        runtime, _ = image_policies(image, PAYLOAD, "image", story.memory_mb())

        async def add() -> None:
            tenant = story.cluster.tenant()
            try:
                await tenant.add_policy("runtime", runtime, "image")
                await tenant.add_policy("measured-boot", seabios_mb_policy(), "seabios")
            finally:
                await tenant.close()

        asyncio.run(add())
        plains, attested, payloads = [], [], []
        for _ in range(runs):
            plains.append(plain(story))
            to_attested, to_payload = trusted(story, tmp)
            attested.append(to_attested)
            payloads.append(to_payload)
        print(f"p50 over {runs} runs (qemu TCG, 1 vCPU, 512 MiB, {FLAVOR}):")
        for name, values in (
            ("plain POST /servers -> ACTIVE", plains),
            ("trusted-nova boot --wait -> attested", attested),
            ("trusted-nova boot --wait -> payload ran", payloads),
        ):
            shown = ", ".join(f"{v:.1f}" for v in values)
            print(f"  {name:42s} {statistics.median(values):6.1f} s   (runs: {shown})")
    finally:
        story.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(int(sys.argv[1]) if len(sys.argv) > 1 else 3))
