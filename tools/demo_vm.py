#!/usr/bin/env python3
"""``make demo VM=1``: the trusted-boot story in a real virtual machine.

The same story as ``make demo``, with a real guest instead of emulated
nodes: the operator's guest image (Debian, cloud-init, the node agent)
boots under qemu with UEFI firmware and a virtual TPM, as Nova boots it
with ``hw:tpm_version=2.0``. The tenant builds its policies from that
image, the verifier checks the guest's own firmware log and kernel IMA
list, the payload runs inside the guest; then an unknown program run in
the guest gets the node revoked. Takes 3-6 minutes (qemu without KVM).
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nova_plugin.policygen import PAYLOAD_PATH  # noqa: E402
from tools.demo import say, step  # noqa: E402
from trusted_testing.guest_vm import ImageError, build  # noqa: E402
from trusted_testing.guest_vm_boot import VmGuestError  # noqa: E402
from trusted_testing.guest_vm_story import StoryNode, VmCluster  # noqa: E402
from trusted_testing.nocloud import SeedError  # noqa: E402

INTERVAL = 3.0
PAYLOAD = b"""#!/bin/sh
echo "Hello from the tenant's secret payload, inside VM $TRUSTED_NODE_UUID."
echo "It was decrypted only after this VM proved its boot and its programs."
"""


def story(cluster: VmCluster) -> None:
    step(1, "The guest image (built once with diskimage-builder, then cached)")
    image = build()
    say(f"   {image.qcow2}")
    say("   Debian 12, cloud-init, the node agent; the kernel measures every")
    say("   program it runs (IMA). Its kernel and files are what you trust.")
    step(2, "Your VM boots: UEFI firmware, a virtual TPM, cloud-init")
    cluster.prepare()
    node = StoryNode.boot(cluster, image, str(uuid.uuid4()), PAYLOAD)
    try:
        told(cluster, node)
    finally:
        node.guest.stop()


def told(cluster: VmCluster, node: StoryNode) -> None:
    """Steps 2-5 with the VM running."""
    say(f"   VM {node.uuid}; its vTPM's endorsement certificate is signed by")
    say("   the compute host's CA, which the registrar trusts.")
    rules = len(node.runtime_policy["digests"])
    say(f"   Your policies, built from the image: {rules:,} files it may run")
    say("   or read, plus your payload; the kernel OVMF will measure.")
    node.wait_registered(900.0)
    say(f"   {node.marks['agent registered']:.0f} s: the agent registered its TPM.")
    step(3, "You enrol the VM: half of your key, its identity quote, the other half")
    node.enrol()
    say("   The verifier got half V of your payload key; through it, the VM's")
    say("   TPM proved it holds the registered key; then the VM got half U: the")
    say("   sealed payload was in its user-data from the start, unreadable")
    say("   without both halves.")
    status = node.wait_attested(300.0)
    say(f"   The verifier checked the firmware's log and {status['ima_entries']:,}")
    say(f"   IMA entries against your policies: {status['state'].upper()}.")
    node.wait_payload(120.0)
    output = node.guest.agent.read_file(PAYLOAD_PATH + ".out").decode()
    step(4, "Your payload ran inside the VM; its output:")
    for line in output.splitlines():
        say(f"      | {line}")
    step(5, "Someone runs a program your image does not have")
    ran = node.guest.agent.shell(
        "printf '#!/bin/sh\\necho mining\\n' > /root/miner; "
        "chmod +x /root/miner; /root/miner"
    )
    say(f"   /root/miner ran (exit {ran.exit_code}); the kernel measured it.")
    revoked = cluster.wait_node(node.uuid, ("revoked",), 20 * INTERVAL)
    say(f"   The verifier revoked the VM: {revoked['failure_reason'][:160]}")
    for record in cluster.wait_hooks(node.uuid, 30.0):
        say(f"   Revocation hook '{record['action']}' acted ({record['reason']}).")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="demo-vm-") as tmp:
        cluster = VmCluster(os.path.join(tmp, "cluster"), INTERVAL)
        try:
            story(cluster)
        except (ImageError, VmGuestError, SeedError, AssertionError) as exc:
            say(f"\nThe demo stopped: {exc}")
            return 1
        finally:
            cluster.stop()
    say("\nDemo complete: the payload reached the VM only once it proved its")
    say("state, and the VM was cut off when it ran something unknown.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
