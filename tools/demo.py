#!/usr/bin/env python3
"""``make demo``: the trusted-boot story on one machine, told to a tenant.

Three nodes, each with its own software TPM, register with the registrar.
The tenant enrols one payload to all three; each node proves its boot state
and receives the key to decrypt it; the verifier keeps checking their boot
chain (firmware event log) and every program they run (the kernel's IMA
list) against the tenant's policies. Then someone runs an unknown program
on one node: the verifier revokes it, naming the file, and the revocation
hook fires.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nova_plugin.tenant import Tenant  # noqa: E402
from trusted_testing.cluster import PCR, LocalCluster, wait_until  # noqa: E402
from trusted_testing.softkernel import SoftKernel  # noqa: E402
from verifier.protocol import PcrPolicy  # noqa: E402
from verifier.protocol.ima import parse_ascii, policy_from_log  # noqa: E402

GOLDEN_PROGRAMS = (
    ("/usr/bin/python3.11", b"python interpreter"),
    ("/usr/sbin/nginx", b"web server"),
)

PAYLOAD = b"""#!/bin/sh
echo "Hello from the tenant's secret payload on node $TRUSTED_NODE_UUID."
echo "It was decrypted only after this node proved its boot state."
"""


def say(text: str = "") -> None:
    print(text, flush=True)


def step(number: int, text: str) -> None:
    say()
    say(f"== {number}. {text}")


async def _node_states(tenant: Tenant) -> dict[str, dict[str, object]]:
    return {n["uuid"]: dict(n) for n in await tenant.nodes()}


def states(tenant: Tenant) -> dict[str, dict[str, object]]:
    return asyncio.get_event_loop().run_until_complete(_node_states(tenant))


def _exit_on_sigterm() -> None:
    # turn SIGTERM (e.g. from timeout) into SystemExit, so that the
    # clean-up in finally blocks and atexit stops every process started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def main() -> int:
    _exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", default=".demo")
    parser.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="seconds between integrity quotes (default 1)",
    )
    args = parser.parse_args()
    cluster = LocalCluster(args.workdir, nodes=3, interval=args.interval, evidence=True)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return run(cluster, args.interval)
    except Exception as exc:
        say(f"\nThe demo stopped: {exc}")
        say(f"Logs are in {cluster.workdir}.")
        return 1
    finally:
        cluster.stop()
        say("\nEverything the demo started has been stopped.")


def run(cluster: LocalCluster, interval: float) -> int:
    loop = asyncio.get_event_loop()
    step(1, "Starting the trust services")
    cluster.start_services()
    say(f"   registrar  {cluster.registrar_url}   (knows each node's TPM)")
    say(f"   verifier   {cluster.verifier_url}   (checks quotes every {interval:g} s)")
    say("   Each node has its own TPM (swtpm) with a manufacturer certificate;")
    say("   its firmware measured the golden boot image into PCR 16 and logged")
    say("   the boot chain; its kernel measures every program it runs (IMA).")

    step(2, "Starting three nodes; each proves its TPM to the registrar")
    for node in cluster.nodes:
        for path, content in GOLDEN_PROGRAMS:
            _kernel(node).measure(path, content)
        # the tenant never talks to a node: its certificate is no good there
        node.agent_options = {**node.agent_options, "tenant_clients": "nobody"}
        cluster.start_agent(node)
    tenant = cluster.tenant()
    for node in cluster.nodes:
        ok = wait_until(lambda n=node: _activated(loop, tenant, n.uuid), 30)
        if not ok:
            raise RuntimeError(f"node {node.index} did not register; see {node.log}")
        say(
            f"   node {node.index} ({node.uuid}): EK certificate checked, "
            "attestation key activated"
        )

    step(3, "The tenant enrols one encrypted payload to all three nodes")
    policy = PcrPolicy.from_dict({"pcrs": {str(PCR): [cluster.good_pcr_hex()]}})
    say(f"   PCR policy: PCR {PCR} must equal {cluster.good_pcr_hex()[:16]}...")
    with open(_kernel(cluster.nodes[0]).ima_path, encoding="utf-8") as f:
        golden = policy_from_log(parse_ascii(f.read()), "web-tier", 1)
    loop.run_until_complete(tenant.add_policy("runtime", golden.to_dict()))
    loop.run_until_complete(
        tenant.add_policy("measured-boot", SoftKernel.golden_mb_policy(), name="fw")
    )
    say(
        f"   runtime policy 'web-tier': the {len(golden)} programs of a known-good "
        "node;"
    )
    say("   measured-boot policy 'fw': Secure Boot on, the golden boot loader")
    say("   and kernel. Both are stored once at the verifier, shared by all nodes.")
    say("   The tenant keeps the payload key K = U xor V: the verifier gets V,")
    say("   the node gets U, nobody but the tenant ever holds K.")
    say("   The tenant never connects to a node: it asks the verifier to fetch a")
    say("   fresh identity quote over the tenant's own random number, checks that")
    say("   quote itself, and hands U -- locked to that node's key, so the")
    say("   verifier cannot read it -- to the verifier to pass on.")
    for node in cluster.nodes:
        loop.run_until_complete(
            tenant.enrol(
                node.uuid, PAYLOAD, policy, runtime_policy="web-tier", mb_policy="fw"
            )
        )
        say(
            f"   node {node.index}: identity quote checked by the tenant; U and "
            "the sealed payload passed on by the verifier"
        )

    step(4, "The verifier checks each node and releases V; the payload runs")
    for node in cluster.nodes:
        status = wait_until(node.payload_status, 30)
        if not status:
            raise RuntimeError(f"node {node.index} did not decrypt its payload")
        output = (node.payload_output() or "").strip().splitlines()
        say(
            f"   node {node.index}: attested, payload decrypted and run "
            f"(exit code {status['exit_code']}):"
        )
        for line in output:
            say(f"      | {line}")

    step(5, "Someone runs an unknown program on node 2")
    victim = cluster.nodes[1]
    _kernel(victim).measure("/tmp/.cache/cryptominer", b"not the tenant's code")
    tampered_at = time.monotonic()
    say("   Node 2's kernel measured /tmp/.cache/cryptominer into PCR 10 and its")
    say("   IMA list; the file is not in the tenant's runtime policy.")
    revoked = wait_until(
        lambda: states(tenant)[victim.uuid]["state"] == "revoked", 4 * interval + 5
    )
    took = time.monotonic() - tampered_at
    if not revoked:
        raise RuntimeError("the verifier did not revoke node 2")
    node2 = states(tenant)[victim.uuid]
    say(
        f"   The verifier revoked node 2 after {took:.1f} s "
        f"({took / interval:.1f} quote intervals)."
    )
    say(f"   reason: {node2['failure_reason']}")

    step(6, "The revocation hook fires")
    records = wait_until(cluster.hook_records, 10)
    if not records:
        raise RuntimeError("no revocation hook record")
    for rec in records:
        say(f"   hook '{rec['action']}' acted on signed event {rec['event_id']}:")
        say(f"      node {rec['node_uuid']} revoked ({rec['reason']})")
    wait_until(
        lambda: all(e["delivered"] for e in loop.run_until_complete(tenant.events())),
        10,
    )
    events = loop.run_until_complete(tenant.events())
    say(
        f"   {len(events)} signed revocation event(s) in the verifier's outbox, "
        f"delivered: {all(e['delivered'] for e in events)}"
    )

    step(7, "The other nodes stay trusted")
    time.sleep(interval * 1.5)
    final = states(tenant)
    for node in cluster.nodes:
        st = final[node.uuid]
        say(
            f"   node {node.index}: {st['state']:<9} "
            f"({st['quotes_verified']} quotes verified)"
        )
    loop.run_until_complete(tenant.close())
    good = [final[n.uuid]["state"] for n in cluster.nodes if n is not victim]
    if good != ["attested", "attested"]:
        raise RuntimeError("an untampered node is not attested")
    say("\nDemo complete: the payload reached only nodes that proved their state,")
    say("and the tampered node was cut off.")
    return 0


def _kernel(node: object) -> SoftKernel:
    kernel = getattr(node, "kernel", None)
    assert isinstance(kernel, SoftKernel)
    return kernel


def _activated(loop: asyncio.AbstractEventLoop, tenant: Tenant, uuid: str) -> bool:
    from nova_plugin.exceptions import TenantError

    try:
        loop.run_until_complete(tenant.identity(uuid))
        return True
    except TenantError:
        return False


if __name__ == "__main__":
    sys.exit(main())
