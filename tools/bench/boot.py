#!/usr/bin/env python3
"""Trusted boot through Nova: wall time and overhead (prints figures).

Real Nova 34 in its in-process functional environment (API, conductor,
scheduler, compute with the fake virt driver, placement), a real registrar
and verifier (LocalCluster) and the Nova notification listener, as in
nova_plugin/tests/functional/nova_boot_cases.py. For 1 server and for
--bulk servers in one request (--min-count), it measures, as medians:

* plain ``servers.create`` (novaclient, same session, plaintext user-data);
* ``trusted-nova boot`` up to every instance enrolled (sealing, user-data,
  create, one enrolment per instance), and its overhead over plain;
* sealing alone (K, AES-GCM, cloud-init document);
* for one server with an agent on swtpm: boot to bootstrapped (agent
  registered, identity quote, U sent, first integrity quote, V released).

Run: ``.venv/bin/python tools/bench/boot.py [--runs 3] [--bulk 50]``
"""

from __future__ import annotations

import os

os.environ["OS_NOVA_DISABLE_EVENTLET_PATCHING"] = "1"

import argparse  # noqa: E402
import asyncio  # noqa: E402
import base64  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import unittest  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from nova_plugin.tests.functional import nova_boot_cases  # noqa: E402

ARGS = argparse.Namespace(runs=3, bulk=50)
OUT = sys.stdout  # Nova's fixtures capture sys.stdout/stderr during the run


def say(*args: object) -> None:
    print(*args, file=OUT, flush=True)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


class BootBench(nova_boot_cases.TrustedNovaBootTest):
    # the API answers when it accepted the request, as a real Nova does
    # (the test base turns RPC casts into calls: builds inside the request)
    CAST_AS_CALL = False

    def _setup_services(self) -> None:
        # room for the bulk request: no quota, a large fake hypervisor
        self.flags(instances=-1, cores=-1, ram=-1, group="quota")
        self.flags(compute_driver="fake.FakeDriver")
        super()._setup_services()

    def nova(self):  # type: ignore[no-untyped-def]
        from keystoneauth1 import noauth, session
        from novaclient import client

        sess = session.Session(
            auth=noauth.NoAuth(endpoint=self.api_fixture.base_url),
            additional_headers={
                "X-Auth-User": "bench",
                "X-Auth-Project-Id": nova_boot_cases.nova_fixtures.PROJECT_ID,
                "X-Roles": "reader,member",
            },
        )
        return client.Client("2.1", session=sess)

    def setUp(self) -> None:
        super().setUp()
        import warnings

        from sqlalchemy.exc import SADeprecationWarning

        # Nova's test fixtures make this an error; deleting servers that are
        # still building trips it inside Nova (not a figure we measure)
        warnings.filterwarnings("ignore", category=SADeprecationWarning)

    def delete_all(self, nova) -> None:  # type: ignore[no-untyped-def]
        for server in nova.servers.list():
            nova.servers.delete(server.id)
        nova_boot_cases.wait_until(lambda: not nova.servers.list(), 120, 0.5)

    def plain(self, nova, count: int) -> float:  # type: ignore[no-untyped-def]
        flavor = nova.flavors.get(self.flavor)
        start = time.perf_counter()
        nova.servers.create(
            "plain",
            self.image,
            flavor,
            userdata=nova_boot_cases.PAYLOAD,
            min_count=count,
            max_count=count,
        )
        return time.perf_counter() - start

    def trusted(self, nova, count: int) -> float:  # type: ignore[no-untyped-def]
        from nova_plugin.boot import ServerSpec, TrustedBoot
        from verifier.protocol import PcrPolicy

        policy = PcrPolicy.from_dict(
            {"pcrs": {str(nova_boot_cases.PCR): [self.cluster.good_pcr_hex()]}}
        )

        async def go() -> float:
            tenant = self.cluster.tenant()
            try:
                boot = TrustedBoot(nova, tenant, policy, self.cluster.registrar_url)
                spec = ServerSpec("trusted", self.image, str(self.flavor), count)
                start = time.perf_counter()
                result = await boot.boot(spec, nova_boot_cases.PAYLOAD, wait=False)
                elapsed = time.perf_counter() - start
                assert len(result.servers) == count
                return elapsed
            finally:
                await tenant.close()

        return asyncio.run(go())

    def sealing(self) -> float:
        from nova_plugin.boot import prepare_user_data

        with open(self.cluster.pki_file("ca.pem"), encoding="utf-8") as f:
            ca_pem = f.read()
        start = time.perf_counter()
        for _ in range(100):
            prepare_user_data(nova_boot_cases.PAYLOAD, "https://r", ca_pem)
        return (time.perf_counter() - start) / 100

    def bootstrapped(self) -> float:
        done = threading.Event()

        def agent() -> None:
            found = nova_boot_cases.wait_until(lambda: self.servers(), 30, 0.1)
            if found:
                # the guest's agent has the user-data (U comes alone)
                uuid = found[0]["id"]
                view = self.admin_api.get_server(uuid)
                path = os.path.join(self.cluster.workdir, f"user-data-{uuid}")
                with open(path, "wb") as f:
                    f.write(base64.b64decode(view["OS-EXT-SRV-ATTR:user_data"]))
                self.cluster.add_node(uuid, {"user_data_file": path})
            done.wait()

        thread = threading.Thread(target=agent)
        thread.start()
        try:
            start = time.perf_counter()
            code, _, err = self.run_cli(self.boot_argv("--wait", "--quiet"))
            elapsed = time.perf_counter() - start
        finally:
            done.set()
            thread.join()
        assert code == 0, err
        return elapsed

    def test_bench(self) -> None:
        nova = self.nova()
        rows = []
        for count in (1, ARGS.bulk):
            plain, trusted = [], []
            for _ in range(ARGS.runs):
                plain.append(self.plain(nova, count))
                self.delete_all(nova)
                trusted.append(self.trusted(nova, count))
                self.delete_all(nova)
            rows.append((count, _median(plain), _median(trusted)))
            say(f"{count} server(s): plain {plain}, trusted {trusted}")
        seal = self.sealing()
        boot = self.bootstrapped()
        say()
        say(
            f"trusted boot through Nova 34 (in-process, fake driver), "
            f"medians of {ARGS.runs} runs"
        )
        say(
            f"{'servers':>8} {'plain create s':>15} {'trusted s':>10} "
            f"{'overhead s':>11} {'per server ms':>14}"
        )
        for count, p, t in rows:
            say(
                f"{count:>8} {p:>15.3f} {t:>10.3f} {t - p:>11.3f} "
                f"{(t - p) / count * 1000:>14.1f}"
            )
        say(f"sealing (K, AES-GCM, cloud-init user-data): {seal * 1000:.2f} ms")
        say(f"1 server, boot --wait to bootstrapped (agent on swtpm): {boot:.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per figure")
    parser.add_argument("--bulk", type=int, default=50, help="servers in bulk")
    parser.parse_args(namespace=ARGS)
    suite = unittest.TestSuite([BootBench("test_bench")])
    result = unittest.TextTestRunner(verbosity=0, stream=OUT).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
