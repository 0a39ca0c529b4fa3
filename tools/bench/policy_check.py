#!/usr/bin/env python3
"""The dry run of a runtime policy (``trusted-tenant policy check``): what
it costs per node.

1. **Core** (always): the verifier's judging of one node's answer by
   :class:`~verifier.protocol.attestation.PolicyDryRun` -- parse the quote
   answer, verify the ECC P-256 quote over the nonce, parse the node's whole
   ASCII IMA list (``--entries``, default 3,000), replay it into PCR 10,
   check the boot aggregate and judge every entry against a policy of
   ``--paths`` paths (default 60,000), ``--failing`` of the entries (default
   1 %) refused and listed. The node is a SoftTpm with a SoftKernel, so the
   quote and the list are real; only the verifier's work is timed. Prints
   the median wall and CPU time per node.

2. **Cluster** (``--nodes N``, default 4; 0 skips it): a real registrar,
   verifier and N agent processes on swtpm, each node's soft kernel having
   measured ``--entries`` files; the nodes are enrolled under the policy
   and ``POST /v1/policies/runtime/{ref}/check {"all": true}`` is timed
   from the tenant's side, with the verifier process's CPU time, over
   ``--repeat`` runs. Prints medians per check and per node.

    .venv/bin/python tools/bench/policy_check.py [--entries 3000]
        [--paths 60000] [--failing 0.01] [--nodes 4] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from trusted_testing.procstat import cpu_seconds  # noqa: E402
from trusted_testing.softkernel import SoftKernel  # noqa: E402
from trusted_testing.softtpm import SoftTpm  # noqa: E402
from verifier.protocol import AttestationKey, PcrPolicy, bind_nonce  # noqa: E402
from verifier.protocol.attestation import PolicyDryRun  # noqa: E402
from verifier.protocol.ima import (  # noqa: E402
    RuntimePolicy,
    parse_ascii,
    policy_from_log,
)
from verifier.protocol.messages.policy_check import CheckResult  # noqa: E402
from verifier.protocol.messages.quote import QuoteRequest  # noqa: E402

NODE = "0b6f3c8e-2d4f-4a51-9c1e-7f3a2b5d6e80"


def _files(entries: int) -> list[tuple[str, bytes]]:
    return [(f"/usr/lib/pkg{i // 50}/file{i}.so", b"v1 %d" % i) for i in range(entries)]


def candidate(list_text: str, paths: int, failing: float) -> RuntimePolicy:
    """A policy allowing the list but ``failing`` of its files, padded to
    ``paths`` paths with files the node never ran."""
    entries = parse_ascii(list_text)
    cut = max(1, int(len(entries) * failing))
    kept = entries[: len(entries) - cut]
    doc = policy_from_log(kept, "web", 2).to_dict()
    digests = doc["digests"]
    for i in range(max(0, paths - len(digests))):
        digests[f"/opt/never-run/{i}"] = ["sha256:" + os.urandom(32).hex()]
    return RuntimePolicy.from_dict(doc)


def core(args: argparse.Namespace) -> None:
    tmp = tempfile.mkdtemp(prefix="bench-dryrun-")
    tpm = SoftTpm(ak_alg="ecc")
    kernel = SoftKernel(tpm.extend, lambda pcrs: {i: tpm.pcrs[i] for i in pcrs}, tmp)
    kernel.boot()
    for path, content in _files(args.entries):
        kernel.measure(path, content)
    with open(kernel.ima_path, encoding="utf-8") as f:
        text = f.read()
    policy = candidate(text, args.paths, args.failing)
    ak = AttestationKey(tpm.ak, activated=True)
    nk = os.urandom(32)
    walls, cpus = [], []
    outcome = None
    for _ in range(args.repeat * 4):
        run = PolicyDryRun(NODE, ak, policy)
        request: QuoteRequest = run.request(os.urandom(20))
        quote = tpm.quote(bind_nonce(request.nonce, nk), request.pcrs)
        answer = {
            "quote": quote.to_dict(),
            "nk": base64.b64encode(nk).decode(),
            "ima": {"from": 0, "format": "ascii", "entries": text, "more": False},
        }
        wall, cpu = time.perf_counter(), time.process_time()
        outcome = run.judge(request, answer)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    assert outcome is not None and outcome.result is CheckResult.FAIL, outcome
    print(
        f"core: {args.entries + 1} entries, policy of {len(policy)} paths, "
        f"{outcome.failures_total} refused entries listed"
    )
    print(
        f"  judging one node: median wall {statistics.median(walls) * 1e3:.1f} ms, "
        f"CPU {statistics.median(cpus) * 1e3:.1f} ms "
        f"({(args.entries + 1) / statistics.median(cpus):,.0f} entries/s)"
    )


def cluster(args: argparse.Namespace) -> None:
    from trusted_testing.cluster import LocalCluster, wait_until
    from trusted_testing.e2e import Http

    tmp = tempfile.mkdtemp(prefix="bench-dryrun-cluster-")
    c = LocalCluster(
        os.path.join(tmp, "c"), nodes=args.nodes, interval=1.0, evidence=True
    )
    loop = asyncio.new_event_loop()
    try:
        c.start_services()
        files = _files(args.entries)
        start = time.perf_counter()
        for node in c.nodes:
            assert node.kernel is not None
            for path, content in files:
                node.kernel.measure(path, content)
            c.start_agent(node)
        print(
            f"cluster: {args.nodes} nodes measured {args.entries} files each "
            f"into swtpm in {time.perf_counter() - start:.0f} s"
        )
        http = Http(c)

        def registered(uuid: str) -> bool:
            r = http.call("GET", f"{c.registrar_url}/v1/agents/{uuid}")
            return r.status_code == 200 and r.json()["activated"] is True

        tenant = c.tenant()
        assert c.nodes[0].kernel is not None
        with open(c.nodes[0].kernel.ima_path, encoding="utf-8") as f:
            text = f.read()
        current = policy_from_log(parse_ascii(text), "web", 1)
        loop.run_until_complete(tenant.add_policy("runtime", current.to_dict()))
        policy = candidate(text, args.paths, args.failing)
        loop.run_until_complete(tenant.add_policy("runtime", policy.to_dict()))
        for node in c.nodes:
            wait_until(lambda n=node: registered(n.uuid), 60)
            loop.run_until_complete(
                tenant.enrol(
                    node.uuid, b"#!/bin/sh\n", PcrPolicy({}), runtime_policy="web@1"
                )
            )
        for node in c.nodes:
            wait_until(
                lambda n=node: (c.node_status(n.uuid) or {}).get("state") == "attested",
                60,
            )
        pid = c.procs["verifier"].pid
        walls, cpus = [], []
        for _ in range(args.repeat):
            cpu, wall = cpu_seconds(pid), time.perf_counter()
            report = loop.run_until_complete(
                tenant.check_policy("web@2", everything=True)
            )
            walls.append(time.perf_counter() - wall)
            cpus.append(cpu_seconds(pid) - cpu)
            results = {r.result for r in report.results}
            assert results == {CheckResult.FAIL}, report
        wall, cpu = statistics.median(walls), statistics.median(cpus)
        print(
            f"  check --all of {args.nodes} nodes (real agents, mTLS, fresh "
            f"quotes): median wall {wall:.2f} s ({wall / args.nodes * 1e3:.0f} "
            f"ms/node), verifier CPU {cpu:.2f} s ({cpu / args.nodes * 1e3:.0f} "
            "ms/node; its quote loop runs meanwhile)"
        )
        loop.run_until_complete(tenant.close())
    finally:
        loop.close()
        c.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=3000)
    parser.add_argument("--paths", type=int, default=60_000)
    parser.add_argument("--failing", type=float, default=0.01)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    core(args)
    if args.nodes:
        cluster(args)


if __name__ == "__main__":
    main()
