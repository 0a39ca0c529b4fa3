#!/usr/bin/env python3
"""Per-request cost of Keystone authentication on the verifier's API.

Serves the real verifier application (in-process aiohttp, a node enrolled
in project ``alpha``) and times ``GET /v1/nodes/{uuid}`` over one
kept-alive HTTP connection, three ways:

* ``open``: no authentication (the in-process ``noauth`` caller; the
  policy is still enforced): the cost of everything but identity.
* ``keystone cached``: a Keystone token (real Keystone 30, SQLite,
  fernet) validated by keystonemiddleware through the adapter, after the
  first request put it in auth_token's in-process cache.
* ``keystone first``: a fresh token each time (one validation round trip
  to Keystone per request; what a cache miss costs).

Rows are CPU time of this process per request (the machine is shared, so
wall time would count other processes' turns) and wall time per request;
the Keystone process's own CPU is not in the CPU column.

    .venv/bin/python tools/bench/auth_cost.py [--n 2000] [--fresh 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

import aiohttp  # noqa: E402
from aiohttp.test_utils import TestServer  # noqa: E402
from oslo_config import cfg  # noqa: E402

from trusted_testing.keystone import Keystone  # noqa: E402
from verifier import conf as vconf  # noqa: E402
from verifier.api.authz import Auth  # noqa: E402
from verifier.api.keystone import KeystoneAuthenticator  # noqa: E402
from verifier.api.verifier_app import make_app  # noqa: E402
from verifier.policies import make_enforcer  # noqa: E402
from verifier.tests.unit.test_attest_service import VerifierServiceBase  # noqa: E402


def _conf(tmp: str, ks: Keystone) -> cfg.ConfigOpts:
    path = os.path.join(tmp, "v.conf")
    with open(path, "w") as f:
        f.write(
            f"[keystone_authtoken]\nwww_authenticate_uri = {ks.url}\n"
            f"auth_url = {ks.url}\nauth_type = password\ninterface = public\n"
            "username = attestation\npassword = attestation-secret\n"
            "project_name = service\nuser_domain_id = default\n"
            "project_domain_id = default\n"
        )
    conf = cfg.ConfigOpts()
    vconf.register_opts(conf)
    conf(["--config-file", path], project="trusted-cloud")
    return conf


async def _time(
    http: aiohttp.ClientSession, url: str, tokens: list[str | None]
) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    for token in tokens:
        headers = {"X-Auth-Token": token} if token else {}
        async with http.get(url, headers=headers) as resp:
            await resp.read()
            assert resp.status == 200, resp.status
    n = len(tokens)
    return (time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6


async def run(args: argparse.Namespace, tmp: str, ks: Keystone) -> None:
    alpha = ks.add_project("alpha")
    alice = ks.add_user("alice", "alpha", alpha, ["member"])
    service = ks.add_project("service")
    ks.add_user("attestation", "service", service, ["service"])
    base = VerifierServiceBase()
    base.setUp()
    verifier = base.new_verifier()
    verifier.pause_attestation()
    agent = base.new_agent()
    await verifier.commands.enrol(
        agent.uuid, os.urandom(32), base.policy, project=alpha
    )
    conf = _conf(tmp, ks)
    enforcer = make_enforcer(conf)
    apps = {
        "open": Auth(enforcer, open_without_tls=True),
        "keystone": Auth(enforcer, KeystoneAuthenticator(conf)),
    }
    token = ks.user_token(alice)
    fresh = [ks.user_token(alice) for _ in range(args.fresh)]
    rows = []
    for name, auth in apps.items():
        server = TestServer(make_app(verifier, "PEM", auth), host="127.0.0.1")
        await server.start_server()
        url = str(server.make_url(f"/v1/nodes/{agent.uuid}"))
        async with aiohttp.ClientSession() as http:
            if name == "open":
                runs = [await _time(http, url, [None] * args.n) for _ in range(3)]
                rows.append(("open (no identity)", runs))
            else:
                await _time(http, url, [token])  # into the cache
                runs = [await _time(http, url, [token] * args.n) for _ in range(3)]
                rows.append(("keystone, cached token", runs))
                runs = [await _time(http, url, fresh)]
                rows.append(("keystone, first use of a token", runs))
        await server.close()
    await verifier.stop()
    print(f"GET /v1/nodes/{{uuid}}, {args.n} requests per run, median of runs")
    print(f"{'mode':34} {'CPU us/req':>11} {'wall us/req':>12}")
    for name, runs in rows:
        cpu = statistics.median(r[0] for r in runs)
        wall = statistics.median(r[1] for r in runs)
        print(f"{name:34} {cpu:11.0f} {wall:12.0f}")
    print(f"load average (1 min): {os.getloadavg()[0]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--fresh", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ks = Keystone(os.path.join(tmp, "keystone"))
        ks.start()
        try:
            asyncio.run(run(args, tmp, ks))
        finally:
            ks.stop()


if __name__ == "__main__":
    main()
