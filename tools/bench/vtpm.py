#!/usr/bin/env python3
"""Companion vTPM costs on real libvirt (embedded qemu driver, TCG, swtpm)
with the real registrar (LocalCluster, mTLS):

* ensure-vTPM latency per instance (redefine + swtpm_setup state + EK read
  back + provider registration with the registrar), and its parts;
* the resident memory of each domain's swtpm process;
* N domains started together (qemu + swtpm per domain, started paused by
  default so that N TCG guests do not burn a shared machine's CPUs; with
  ``--boot`` the tiny guest boots, and the time until every guest printed
  its /dev/tpm0 is reported too).

    .venv/bin/python tools/bench/vtpm.py [--instances 10] [--together 10] [--boot]

Run as root (the embedded qemu driver starts qemu and swtpm as root).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid as uuid_mod

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

import libvirt  # noqa: E402

from trusted_testing.cluster import LocalCluster  # noqa: E402
from trusted_testing.embedded_libvirt import (  # noqa: E402
    EmbeddedLibvirt,
    domain_xml,
    guest_image,
    wait_for,
)
from trusted_testing.procstat import rss_kib  # noqa: E402
from trusted_testing.swtpm import ek_ca_bundle  # noqa: E402
from verifier.ca import CertificateAuthority  # noqa: E402
from verifier.common import tls as tlsutil  # noqa: E402
from vtpm_manager import swtpm_state  # noqa: E402
from vtpm_manager.manager import ManagerConfig, VtpmManager  # noqa: E402
from vtpm_manager.registrar_client import ProviderRegistrarClient  # noqa: E402


def _ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:7.1f} ms  (n={len(values)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=10)
    parser.add_argument("--together", type=int, default=10)
    parser.add_argument("--boot", action="store_true")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="vtpm-bench-")
    lv = cluster = None
    try:
        localca = os.path.join(tmp, "localca")
        swtpm_state.create_state(os.path.join(tmp, "ca-init", "tpm2"), localca, "ca")
        bundle = os.path.join(tmp, "ek-ca.pem")
        with open(bundle, "wb") as f:
            f.write(ek_ca_bundle(localca))
        cluster = LocalCluster(
            os.path.join(tmp, "cluster"),
            nodes=0,
            registrar_options={"ek_ca_bundle": bundle, "require_ek_certificate": True},
        )
        cluster.start_services()
        pki = cluster.pki
        ca = CertificateAuthority.load(pki)
        ca.issue_to_files(pki, "vtpm-manager", ["127.0.0.1"])
        cert, key = f"{pki}/vtpm-manager.pem", f"{pki}/vtpm-manager-key.pem"
        client = ProviderRegistrarClient(
            cluster.registrar_url,
            tlsutil.client_context(cert, key, f"{pki}/ca.pem"),
        )
        lv = EmbeddedLibvirt(prefix="vtpm-bench-libvirt-")
        config = ManagerConfig(lv.swtpm_storage_dir, localca)
        manager = VtpmManager(lv.conn, client, config)
        image = guest_image() if args.boot else None
        count = max(args.instances, args.together)
        doms = []
        for i in range(count):
            uuid = str(uuid_mod.uuid4())
            xml = domain_xml(
                f"vtpm-bench-{i}-{uuid[:8]}", uuid, f"{tmp}/serial-{i}.log", image, 96
            )
            doms.append(lv.conn.defineXML(xml))

        ensure, setup, read, register = [], [], [], []
        for dom in doms[: args.instances]:
            t0 = time.perf_counter()
            result = manager.ensure(dom.name())
            ensure.append(time.perf_counter() - t0)
            # The parts, on a fresh state of the same kind.
            part = os.path.join(tmp, "parts", dom.UUIDString(), "tpm2")
            t0 = time.perf_counter()
            swtpm_state.create_state(part, localca, "part")
            setup.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ek = swtpm_state.read_ek(part)
            read.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            client.register_ek(str(uuid_mod.uuid4()), ek)
            register.append(time.perf_counter() - t0)
            assert result.newly_registered
        for dom in doms[args.instances :]:
            manager.ensure(dom.name())
        print(f"ensure vTPM + registration ({args.instances} instances):")
        print(f"  ensure (all steps)     {_ms(ensure)}")
        print(f"  swtpm_setup state      {_ms(setup)}")
        print(f"  read EK back (swtpm)   {_ms(read)}")
        print(f"  registrar PUT (mTLS)   {_ms(register)}")

        together = doms[: args.together]
        flags = 0 if args.boot else libvirt.VIR_DOMAIN_START_PAUSED
        alone = []
        for dom in together[:3]:
            t0 = time.perf_counter()
            dom.createWithFlags(libvirt.VIR_DOMAIN_START_PAUSED)
            alone.append(time.perf_counter() - t0)
            dom.destroy()
        print("one domain at a time (paused, with vTPM):")
        print(f"  start                  {_ms(alone)}")
        started: list[float] = []
        errors: list[str] = []

        def start(dom: libvirt.virDomain) -> None:
            t0 = time.perf_counter()
            try:
                dom.createWithFlags(flags)
                started.append(time.perf_counter() - t0)
            except libvirt.libvirtError as exc:
                errors.append(str(exc))

        t0 = time.perf_counter()
        threads = [threading.Thread(target=start, args=(d,)) for d in together]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        if errors:
            print("start errors:", *errors, sep="\n  ")
            return 1
        mode = "booting" if args.boot else "paused"
        print(f"{len(together)} domains started together ({mode}, TCG):")
        print(f"  per-domain start       {_ms(started)}")
        print(f"  all running after      {wall * 1000:7.1f} ms")
        pids = lv.swtpm_pids()
        rss = [rss_kib(p) for p in pids]
        qemu = [rss_kib(p) for p in lv._pids("qemu-system-x86_64")]
        print(f"  swtpm processes        {len(pids)}")
        mib = statistics.median(rss) / 1024
        print(f"  swtpm RSS per vTPM     median {mib:.1f} MiB")
        mib = statistics.median(qemu) / 1024
        print(f"  qemu RSS per domain    median {mib:.1f} MiB")
        if args.boot:

            def seen() -> bool:
                for i in range(len(together)):
                    try:
                        with open(f"{tmp}/serial-{i}.log", errors="replace") as f:
                            if "found /dev/tpm0" not in f.read():
                                return False
                    except OSError:
                        return False
                return True

            ok = wait_for(seen, 600, 1.0)
            print(
                f"  all guests saw /dev/tpm0 after {time.perf_counter() - t0:.1f} s"
                if ok
                else "  not every guest saw /dev/tpm0 within 600 s"
            )
        return 0
    finally:
        if lv is not None:
            lv.close()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
