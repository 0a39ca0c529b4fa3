#!/usr/bin/env python3
"""Revocation latency: detection to every plugin done, and faults.

Runs the real pipeline: the verifier's outbox (the same code that stages
an event in the revoking transaction) with the ``messaging`` notifier on a
private RabbitMQ node (the shared broker is never touched) or the
``webhook`` notifier, a ``trusted-revocation-listener`` process running
the ``vault`` action against an OpenBao dev server and then the ``log``
action. Every node has a Vault token, a PKI certificate and its own
transit key, so the ``vault`` action revokes, rotates and searches for
real.

Latency of one revocation = from the moment its event is committed to the
outbox (detection) to the moment the ``log`` action, which runs after
``vault``, has recorded it (the record file is watched every 2 ms).

    .venv/bin/python tools/bench/revocation.py [--sizes 1 100]
        [--transports messaging webhook]

The fault run kills the broker (SIGKILL) once a third of the events were
handled and restarts it 2 s later; it reports events delivered and lost.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid as uuid_mod
import warnings

warnings.filterwarnings("ignore", category=DeprecationWarning)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

import hvac  # noqa: E402

from trusted_testing.openbao import OpenBaoDev  # noqa: E402
from trusted_testing.rabbitmq import PrivateRabbit  # noqa: E402
from trusted_testing.revocation import Pipeline  # noqa: E402

POLICY = """
path "transit/encrypt/{key}" {{ capabilities = ["update"] }}
path "transit/decrypt/{key}" {{ capabilities = ["update"] }}
"""


def vault_setup(bao: OpenBaoDev) -> hvac.Client:
    root = hvac.Client(url=bao.url, token=bao.root_token)
    root.sys.enable_secrets_engine("pki", path="pki")
    root.sys.tune_mount_configuration("pki", max_lease_ttl="87600h")
    root.secrets.pki.generate_root("internal", "bench root", mount_point="pki")
    root.secrets.pki.create_or_update_role(
        "node", {"allow_any_name": True, "ttl": "24h"}, mount_point="pki"
    )
    root.sys.enable_secrets_engine("transit", path="transit")
    return root


def make_node(root: hvac.Client) -> str:
    node = str(uuid_mod.uuid4())
    key = f"k-{node}"
    root.secrets.transit.create_key(key, mount_point="transit")
    root.sys.create_or_update_policy(f"p-{node}", POLICY.format(key=key))
    root.auth.token.create(policies=[f"p-{node}"], meta={"node_uuid": node}, ttl="2h")
    root.secrets.pki.generate_certificate("node", node, mount_point="pki")
    return node


class Watcher(threading.Thread):
    """Timestamps each event id when it appears in the record file."""

    def __init__(self, path: str) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.seen: dict[str, float] = {}
        self.lines = 0
        self._halt = threading.Event()

    def run(self) -> None:
        offset = 0
        while not self._halt.is_set():
            try:
                with open(self.path, encoding="utf-8") as f:
                    f.seek(offset)
                    chunk = f.read()
            except FileNotFoundError:
                chunk = ""
            now = time.time()
            complete = chunk[: chunk.rfind("\n") + 1]
            offset += len(complete.encode())
            for line in complete.splitlines():
                if line.strip():
                    self.lines += 1
                    self.seen.setdefault(json.loads(line)["event_id"], now)
            time.sleep(0.002)

    def stop(self) -> None:
        self._halt.set()


class OutboxLoop(threading.Thread):
    """The verifier's delivery loop (outbox_interval 50 ms)."""

    def __init__(self, pipeline: Pipeline, notifier: str) -> None:
        super().__init__(daemon=True)
        self.outbox = pipeline.outbox([notifier], retry_delay=0.25)
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.outbox.dispatch_once(1000)
            except Exception as exc:  # keep going, as the verifier does
                print(f"  outbox pass failed: {exc}", file=sys.stderr)
            time.sleep(0.05)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.outbox.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def run(
    transport: str,
    n: int,
    rabbit: PrivateRabbit | None,
    fault: bool,
    actions: list[str],
) -> dict[str, float]:
    bao = OpenBaoDev()  # a fresh Vault per case: n nodes, nothing else
    bao.start()
    root = vault_setup(bao)
    with tempfile.TemporaryDirectory(prefix="trusted-bench-rev-") as tmp:
        pipeline = Pipeline(
            tmp,
            rabbit.url if rabbit else None,
            f"bench_{uuid_mod.uuid4().hex[:8]}",
        )
        token = os.path.join(tmp, "vault-token")
        with open(token, "w") as f:
            f.write(bao.root_token)
        try:
            pipeline.start_listener(
                [transport],
                actions=actions,
                extra={
                    "action_vault": {
                        "url": bao.url,
                        "token_file": token,
                        "state_file": os.path.join(tmp, "vault-state.jsonl"),
                    }
                },
            )
            nodes = [make_node(root) for _ in range(n)]
            watcher = Watcher(pipeline.record_file)
            watcher.start()
            loop = OutboxLoop(pipeline, transport)
            loop.start()
            # Warm-up: one revocation end to end, so the listener is
            # connected and running (as in production) before we measure.
            warm = pipeline.revoke(make_node(root)).event.id
            while warm not in watcher.seen:
                time.sleep(0.01)
            del watcher.seen[warm]
            watcher.lines -= 1
            detected: dict[str, float] = {}
            for node in nodes:  # n revocations at once
                signed = pipeline.revoke(node)
                detected[signed.event.id] = time.time()
            killed = False
            deadline = time.time() + 600
            while len(watcher.seen) < n and time.time() < deadline:
                if fault and rabbit and not killed and len(watcher.seen) >= n // 3:
                    rabbit.kill()
                    killed = True
                    time.sleep(2)
                    rabbit.start()
                time.sleep(0.01)
            loop.stop()
            watcher.stop()
            latencies = [
                watcher.seen[i] - t for i, t in detected.items() if i in watcher.seen
            ]
            return {
                "n": n,
                "delivered": len(latencies),
                "lost": n - len(latencies),
                "duplicate_records": watcher.lines - len(watcher.seen),
                "p50_ms": 1000 * statistics.median(latencies) if latencies else 0,
                "p99_ms": 1000 * percentile(latencies, 99) if latencies else 0,
                "broker_killed": killed,
            }
        finally:
            pipeline.close()
            bao.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 100])
    parser.add_argument(
        "--actions",
        default="vault,log",
        help="listener actions, in order; the last must be log (default "
        "%(default)s; 'log' alone measures the delivery path without Vault)",
    )
    parser.add_argument(
        "--transports",
        nargs="+",
        default=["messaging", "webhook"],
        choices=["messaging", "webhook"],
    )
    args = parser.parse_args()
    # The outbox logs every failed try while the broker is down: expected.
    logging.basicConfig(level=logging.ERROR)
    rabbit = PrivateRabbit() if "messaging" in args.transports else None
    print(f"actions: {args.actions}")
    try:
        if rabbit:
            rabbit.start()
        print(
            f"{'transport':10} {'fault':14} {'n':>4} {'delivered':>9} "
            f"{'lost':>4} {'p50 ms':>8} {'p99 ms':>8}"
        )
        cases = [(t, n, False) for t in args.transports for n in args.sizes]
        if rabbit:
            cases += [("messaging", n, True) for n in args.sizes]
        for transport, n, fault in cases:
            r = run(transport, n, rabbit, fault, args.actions.split(","))
            label = "broker killed" if r["broker_killed"] else "-"
            print(
                f"{transport:10} {label:14} {n:>4} {r['delivered']:>9} "
                f"{r['lost']:>4} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f}",
                flush=True,
            )
    finally:
        if rabbit:
            rabbit.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
