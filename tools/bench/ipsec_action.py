#!/usr/bin/env python3
"""How long the ``ipsec`` revocation action takes against real charons.

A hub and N nodes (``--peers``, default 8), each a charon in its own
network namespace (kernel-libipsec), all tunnels up. The nodes are revoked
one by one through the action; for each revocation this measures the
action's wall time (CRL re-signed, loaded, flushed, connection unloaded,
SA terminated and checked gone, swanctl config regenerated); half the
nodes answer the DELETE, the other half no longer do (killed charon;
``terminate_timeout`` 500 ms). Then redelivery of each event (nothing to
do). Prints medians and maxima in milliseconds.
Not a test: nothing is asserted. Needs root (network namespaces).

    .venv/bin/python tools/bench/ipsec_action.py [--peers 8]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from oslo_config import cfg  # noqa: E402

from ipsec_puppet_vault_hooks.actions.ipsec import IpsecAction  # noqa: E402
from trusted_testing.strongswan import (  # noqa: E402
    Lab,
    Site,
)
from verifier.protocol import RevocationEvent  # noqa: E402


def _action(site: Site, **overrides: object) -> IpsecAction:
    conf = cfg.ConfigOpts()
    action = IpsecAction(conf)
    for name, value in {**site.action_settings(), **overrides}.items():
        conf.set_override(name, value, group="action_ipsec")
    conf([])
    return action


def _event(node_uuid: str) -> RevocationEvent:
    return RevocationEvent(
        id=str(uuid.uuid4()),
        node_uuid=node_uuid,
        reason="pcr_policy",
        detail="benchmark",
        created_at="2026-11-22T05:00:00Z",
    )


def _line(label: str, samples: list[float]) -> None:
    print(
        f"{label:<34} n={len(samples):<3} median {statistics.median(samples):7.1f}"
        f" ms   max {max(samples):7.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=8)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    peers = max(2, args.peers)
    lab = Lab(spokes=peers)
    try:
        started = time.monotonic()
        lab.start()
        site = Site(lab)
        site.load_hub()
        for i in range(1, peers + 1):
            lab.charons[f"node{i}"].initiate("hub")
        print(
            f"{peers} peers up in {time.monotonic() - started:.2f} s "
            f"(namespaces, {peers + 1} charons, certificates, IKE)"
        )
        hub = lab.charons["hub"]
        action = _action(site)
        silent = _action(site, terminate_timeout=500)
        first: list[float] = []
        dead: list[float] = []
        again: list[float] = []
        half = peers // 2
        for i in range(1, peers + 1):
            if i > half:  # the second half never answers the DELETE
                node = lab.charons[f"node{i}"]
                assert node.proc is not None
                node.proc.kill()
                node.proc.wait()
            event = _event(site.uuids[i])
            t0 = time.perf_counter()
            (action if i <= half else silent).handle(event)
            (first if i <= half else dead).append((time.perf_counter() - t0) * 1000)
            assert not hub.ike_sas(f"node{i}"), f"node{i} still has an SA"
            t0 = time.perf_counter()
            action.handle(event)
            again.append((time.perf_counter() - t0) * 1000)
        _line("revoke (node answers DELETE)", first)
        _line("revoke (node silent, 500 ms)", dead)
        _line("redelivery (no change)", again)
    finally:
        lab.close()


if __name__ == "__main__":
    main()
