#!/usr/bin/env python3
"""Batched deep quotes against one deep quote per guest check (issue 29).

With real swtpm quotes (one swtpm as the host TPM, one as the guests'
vTPM), for N guests per host and one host interval:

* host TPM quotes per interval, and the host TPM's time for them (the
  measured median latency of a real swtpm quote): (a) batched, one host
  quote over the Merkle root of the interval's guest leaves; (b) one deep
  quote per guest check, one host quote each;
* verifier CPU per guest check (process time, median over runs): (a) the
  guest's quote check + its share of the tree, the proofs and the host
  quote check + its inclusion proof check; (b) ``verify_deep_quote`` (the
  guest's quote and the host quote that binds it); the ratio b/a;
* Placement requests per host per interval from :class:`TraitSync`
  against a real standalone Placement 16: the first interval, steady
  intervals, and an interval in which one host fails (and how long that
  removal took).

    .venv/bin/python tools/bench/hostbatch.py [--guests 1,10,100,1000]
        [--runs 5] [--samples 30] [--hosts 10] [--no-placement]

Not a test: nothing is asserted. The default run takes under a minute.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid as uuid_mod
from collections.abc import Callable
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from trusted_testing.placement import StandalonePlacement  # noqa: E402
from trusted_testing.swtpm import Swtpm, free_port_pair  # noqa: E402
from verifier.common.tpm import Tpm  # noqa: E402
from verifier.placement import PlacementClient, TraitSync  # noqa: E402
from verifier.protocol import hostbatch as hb  # noqa: E402
from verifier.protocol.deepquote import (  # noqa: E402
    DeepQuote,
    host_binding,
    verify_deep_quote,
)
from verifier.protocol.policy import PcrPolicy  # noqa: E402
from verifier.protocol.quote import (  # noqa: E402
    AttestationKey,
    Quote,
    bind_nonce,
    verify_quote,
)
from verifier.protocol.tpm import TpmPublic  # noqa: E402

PCR = 16
_HOST = "6e0a1c2e-0000-4000-8000-000000000001"


@dataclass
class Sample:
    """One guest check's evidence: a real vTPM quote and the real host
    quote of a deep quote binding it."""

    instance: str
    nonce: bytes
    vtpm: Quote
    deep: DeepQuote


@dataclass
class Rig:
    """The two TPMs, their keys and policies, and the samples."""

    host: Tpm
    vtpm: Tpm
    host_ak: AttestationKey
    vtpm_ak: AttestationKey
    vtpm_ek: TpmPublic
    host_policy: PcrPolicy
    vtpm_policy: PcrPolicy
    samples: list[Sample]
    host_quote_s: list[float]
    guest_quote_s: list[float]


def _quote(tpm: Tpm, data: bytes) -> tuple[Quote, float]:
    t0 = time.perf_counter()
    q = tpm.quote(data, [PCR])
    return Quote(q.attest, q.signature, dict(q.pcr_values)), time.perf_counter() - t0


def make_rig(host: Tpm, vtpm: Tpm, samples: int) -> Rig:
    host.pcr_extend(PCR, hashlib.sha256(b"host boot").digest())
    vtpm.pcr_extend(PCR, hashlib.sha256(b"guest boot").digest())
    vtpm_ek = TpmPublic.from_bytes(vtpm.ek_public())
    rig = Rig(
        host,
        vtpm,
        AttestationKey(TpmPublic.from_bytes(host.ak_public()), True),
        AttestationKey(TpmPublic.from_bytes(vtpm.ak_public()), True),
        vtpm_ek,
        PcrPolicy({PCR: frozenset({host.pcr_read([PCR])[PCR]})}),
        PcrPolicy({PCR: frozenset({vtpm.pcr_read([PCR])[PCR]})}),
        [],
        [],
        [],
    )
    for _ in range(samples):
        instance, nonce = str(uuid_mod.uuid4()), os.urandom(20)
        vq, t_guest = _quote(vtpm, bind_nonce(nonce))
        binding = host_binding(nonce, vtpm_ek.name, instance, vq.attest)
        hq, t_host = _quote(host, binding)
        rig.samples.append(Sample(instance, nonce, vq, DeepQuote(vq, hq)))
        rig.guest_quote_s.append(t_guest)
        rig.host_quote_s.append(t_host)
    return rig


def _check_guest(rig: Rig, sample: Sample) -> None:
    verify_quote(
        sample.vtpm,
        ak=rig.vtpm_ak,
        qualifying_data=bind_nonce(sample.nonce),
        policy=rig.vtpm_policy,
    )


def batched_interval(rig: Rig, n: int) -> tuple[float, float, float]:
    """One host interval with ``n`` guests, batched.

    Returns:
        (verifier CPU per guest check, its batch part per guest, the host
        quote's latency), seconds.
    """
    guests = [
        (str(uuid_mod.UUID(int=i + 1)), s)
        for i, s in zip(range(n), itertools.cycle(rig.samples))
    ]
    fresh = os.urandom(20)
    t0 = time.process_time()
    for _, s in guests:
        _check_guest(rig, s)
    t_guests = time.process_time() - t0
    batch = hb.GuestBatch([hb.guest_leaf(u, s.vtpm.attest) for u, s in guests])
    proofs = [batch.proof(i) for i in range(n)]
    t_build = time.process_time() - t0
    # the host agent's quote (real swtpm; not verifier CPU)
    nonce = hb.host_nonce(fresh, batch.root, batch.size)
    nk = fresh + bytes(12)  # the agent binds its NK public key after the nonce
    host_q, latency = _quote(rig.host, bind_nonce(nonce, nk))
    t1 = time.process_time()
    verify_quote(
        host_q,
        ak=rig.host_ak,
        qualifying_data=bind_nonce(nonce, nk),
        policy=rig.host_policy,
    )
    judged = hb.HostRound(
        _HOST, fresh, batch.root, batch.size, host_q.attest, 100.0, True, (nk,)
    )
    for (instance, s), proof in zip(guests, proofs, strict=True):
        hb.verify_guest_in_batch(
            judged,
            host_uuid=judged.host_uuid,
            instance_uuid=instance,
            vtpm_attest=s.vtpm.attest,
            proof=proof,
            now=100.0,
            max_age=60.0,
        )
    total = t_build + time.process_time() - t1
    return total / n, (total - t_guests) / n, latency


def deep_interval(rig: Rig, n: int) -> float:
    """``n`` guest checks, each a deep quote; verifier CPU per check."""
    t0 = time.process_time()
    for _, s in zip(range(n), itertools.cycle(rig.samples)):
        verify_deep_quote(
            s.deep,
            nonce=s.nonce,
            instance_uuid=s.instance,
            vtpm_ek=rig.vtpm_ek,
            vtpm_ak=rig.vtpm_ak,
            vtpm_policy=rig.vtpm_policy,
            host_ak=rig.host_ak,
            host_policy=rig.host_policy,
        )
    return (time.process_time() - t0) / n


def report_quotes(rig: Rig, sizes: list[int], runs: int) -> None:
    host_ms = statistics.median(rig.host_quote_s) * 1000
    print(
        f"real swtpm quote latency: host {host_ms:.1f} ms, guest "
        f"{statistics.median(rig.guest_quote_s) * 1000:.1f} ms "
        f"(median of {len(rig.samples)})"
    )
    print(
        f"{'N':>5} | {'host quotes/int':>15} | {'host TPM ms/int':>17} | "
        f"{'verifier CPU us/guest check':>34} | {'b/a':>5}"
    )
    print(f"{'':>5} | {'a':>6} {'b':>8} | {'a':>7} {'b':>9} | "
          f"{'a (batch part)':>20} {'b':>13} |")  # fmt: skip
    for n in sizes:
        batched_interval(rig, n), deep_interval(rig, n)  # warm up
        runs_a = [batched_interval(rig, n) for _ in range(runs)]
        per_a = statistics.median(r[0] for r in runs_a) * 1e6
        part_a = statistics.median(r[1] for r in runs_a) * 1e6
        lat_a = statistics.median(r[2] for r in runs_a) * 1000
        per_b = statistics.median(deep_interval(rig, n) for _ in range(runs)) * 1e6
        print(
            f"{n:>5} | {1:>6} {n:>8} | {lat_a:>7.1f} {n * host_ms:>9.1f} | "
            f"{per_a:>9.1f} ({part_a:>8.1f}) {per_b:>13.1f} | {per_b / per_a:>5.2f}"
        )


def report_placement(tmp: str, hosts: int) -> None:
    placement = StandalonePlacement(os.path.join(tmp, "placement"))
    placement.start()
    try:
        providers = [
            placement.create_provider(f"compute-{i}", ["COMPUTE_SECURITY_TPM_2_0"])
            for i in range(hosts)
        ]
        client = PlacementClient.noauth(placement.url)
        sync = TraitSync(client, retry_interval=10.0)

        def interval(trusted: Callable[[int], bool]) -> tuple[float, float]:
            before, t0 = client.requests, time.perf_counter()
            for i, p in enumerate(providers):
                sync.want(p, trusted(i))
            sync.pump()
            return (client.requests - before) / hosts, time.perf_counter() - t0

        first, _ = interval(lambda i: True)
        steady = [interval(lambda i: True)[0] for _ in range(3)]
        change, took = interval(lambda i: i != 0)
        print(
            f"Placement requests per host per interval ({hosts} hosts, real "
            f"Placement 16): first {first:.2f}, steady {max(steady):.2f}, one "
            f"host failing {change:.2f} ({change * hosts:.0f} requests; trait "
            f"removed in {took * 1000:.1f} ms)"
        )
    finally:
        placement.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--guests", default="1,10,100,1000")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--hosts", type=int, default=10)
    parser.add_argument("--no-placement", action="store_true")
    args = parser.parse_args()
    try:
        sizes = [int(x) for x in args.guests.split(",")]
    except ValueError:
        parser.error("--guests: comma-separated integers")
    if min(sizes) < 1 or args.runs < 1 or args.samples < 1 or args.hosts < 1:
        parser.error("--guests, --runs, --samples and --hosts must be >= 1")
    tmp = tempfile.mkdtemp(prefix="hostbatch-bench-")
    ca = os.path.join(tmp, "ca")
    tpms = [Swtpm(os.path.join(tmp, n), free_port_pair(), ca) for n in ("h", "v")]
    try:
        for tpm in tpms:
            tpm.start()
        with Tpm(tpms[0].tcti) as host, Tpm(tpms[1].tcti) as vtpm:
            rig = make_rig(host, vtpm, args.samples)
            print(f"batched (a) vs one deep quote per guest check (b), median of "
                  f"{args.runs} runs, one core")  # fmt: skip
            report_quotes(rig, sizes, args.runs)
        if not args.no_placement:
            report_placement(tmp, args.hosts)
    finally:
        for tpm in tpms:
            tpm.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
