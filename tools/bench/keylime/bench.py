"""keylime 7.14.3's verifier against an emulated keylime fleet: quotes/s.

Starts keylime's registrar and verifier (tools/bench/keylime/env.py: own
venv, SQLite, mTLS, quote_interval 0, the shipped defaults otherwise), then
the emulated fleet (tools/bench/keylime/fleet.py, a separate process), which
registers and activates every agent through keylime's registrar. Each agent
is then added to keylime's verifier exactly as ``keylime_tenant -c add``
would (``POST /v2.x/agents/{uuid}`` over mTLS with keylime's generated client
certificate): TPM policy ``{"15": [value], "mask": "0x8000"}`` (keylime
refuses PCR 16 in a policy: it reserves it for the key binding, which it
always checks), an empty runtime policy, no measured-boot policy, a random V.

Once every agent has been given its V (first quote verified), the rate over
the window is counted twice: from the emulator's own counter of integrity
quotes answered, and from keylime's ``attestation_count`` (incremented only
for a quote that passed), read through keylime's REST API before and after
the window. The agents' operational states are reported too (3 = Get Quote;
anything in Failed/Invalid Quote is reported as failed).

With ``--ima K`` (issue 19, "IMA under load") the emulated agents keep
ima-ng lists growing by K entries per quote (the same lists our emulator
serves: trusted_testing/fleet_ima.py); one runtime policy allowing
``--ima-paths`` paths (keylime 7.x's runtime policy JSON, stored once with
``POST /v2.2/allowlists/{name}`` as ``keylime_tenant -c addruntimepolicy``
does) is referenced by name from every agent's add request, and PCR 10 is
added to the TPM policy's mask, as keylime's tenant does when a runtime
policy is given. keylime then asks every quote for the entries from
``ima_ml_entry`` on and replays them from its kept state.

    .venv/bin/python tools/bench/keylime/bench.py [--n 100] [--window 20] [--ima 100]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import aiohttp  # noqa: E402
import env  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
from trusted_testing.fleet_ima import (  # noqa: E402
    BOOT_AGGREGATE_DIGEST,
    ImaLoad,
    file_digest,
    file_path,
)

API = "2.2"
GET_QUOTE, GET_QUOTE_RETRY, PROVIDE_V = 3, 4, 5
FAILED_STATES = {7, 9, 10}  # FAILED, INVALID_QUOTE, TENANT_FAILED
IMA_PCR = 10
POLICY_NAME = "fleet-ima"


def keylime_runtime_policy(paths: int) -> dict:  # type: ignore[type-arg]
    """keylime 7.x's runtime policy (its RUNTIME_POLICY_SCHEMA) allowing
    the boot aggregate and every catalogue file of trusted_testing/fleet_ima
    (digests as bare hex, as keylime-policy writes them)."""
    digests = {file_path(i): [file_digest(i).hex()] for i in range(paths)}
    digests["boot_aggregate"] = [BOOT_AGGREGATE_DIGEST.hex()]
    return {
        "meta": {"version": 1, "generator": 2},  # CompatibleAllowList
        "release": 0,
        "digests": digests,
        "excludes": [],
        "keyrings": {},
        "ima": {"ignored_keyrings": [], "log_hash_alg": "sha1", "dm_policy": None},
        "ima-buf": {},
        "verification-keys": "",
    }


def tree_cpu_seconds(pid: int) -> float:
    """CPU of a process and all its descendants (keylime forks workers)."""
    total = 0.0
    pids = [pid]
    while pids:
        p = pids.pop()
        try:
            with open(f"/proc/{p}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            with open(f"/proc/{p}/task/{p}/children", encoding="ascii") as f:
                pids.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


class VerifierApi:
    def __init__(self, services: env.KeylimeServices) -> None:
        ca = services.cv_ca
        ctx = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH, cafile=os.path.join(ca, "cacert.crt")
        )
        ctx.check_hostname = False
        ctx.load_cert_chain(
            os.path.join(ca, "client-cert.crt"), os.path.join(ca, "client-private.pem")
        )
        self.base = f"{services.verifier_url}/v{API}"
        self.verifier_port = services.verifier_port
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ctx, limit=8)
        )

    async def add_runtime_policy(self, paths: int) -> None:
        """Store the runtime policy once, by name (an admin action)."""
        document = json.dumps(keylime_runtime_policy(paths)).encode()
        body = {
            "runtime_policy": base64.b64encode(document).decode(),
            "runtime_policy_key": None,
            "tpm_policy": None,
        }
        async with self.session.post(
            f"{self.base}/allowlists/{POLICY_NAME}", data=json.dumps(body)
        ) as resp:
            if resp.status not in (200, 201):
                raise RuntimeError(f"keylime refused the policy: {await resp.text()}")

    async def add(self, agent: dict, ready: dict, ima: bool = False) -> None:  # type: ignore[type-arg]
        policy = {str(ready["policy_pcr"]): [ready["policy_value"]]}
        mask = 1 << ready["policy_pcr"]
        if ima:  # as keylime's tenant does for an agent with a runtime policy
            mask |= 1 << IMA_PCR
        policy["mask"] = hex(mask)  # type: ignore[assignment]
        body = {
            "v": base64.b64encode(os.urandom(32)).decode(),
            "cloudagent_ip": "127.0.0.1",
            "cloudagent_port": agent["port"],
            "verifier_ip": "127.0.0.1",
            "verifier_port": self.verifier_port,
            "tpm_policy": json.dumps(policy),
            "runtime_policy": "",
            "runtime_policy_name": POLICY_NAME if ima else None,
            "runtime_policy_key": None,
            "mb_policy": None,
            "mb_policy_name": None,
            "ima_sign_verification_keys": "",
            "metadata": json.dumps({}),
            "revocation_key": "",
            "accept_tpm_hash_algs": ["sha512", "sha384", "sha256"],
            "accept_tpm_encryption_algs": ["ecc", "rsa"],
            "accept_tpm_signing_algs": ["ecschnorr", "rsassa", "ecdsa"],
            "ak_tpm": agent["ak_tpm"],
            "mtls_cert": ready["mtls_cert"],
            "supported_version": API,
        }
        async with self.session.post(
            f"{self.base}/agents/{agent['uuid']}", data=json.dumps(body)
        ) as resp:
            if resp.status != 200:
                raise RuntimeError(f"keylime refused agent: {await resp.text()}")

    async def status(self, uuids: list[str]) -> tuple[int, dict[int, int]]:
        """(sum of attestation_count, {operational_state: count})."""
        sem = asyncio.Semaphore(8)

        async def one(u: str) -> dict:  # type: ignore[type-arg]
            async with sem, self.session.get(f"{self.base}/agents/{u}") as resp:
                return dict((await resp.json(content_type=None))["results"])

        results = await asyncio.gather(*(one(u) for u in uuids))
        states: dict[int, int] = {}
        for r in results:
            states[r["operational_state"]] = states.get(r["operational_state"], 0) + 1
        return sum(int(r.get("attestation_count") or 0) for r in results), states


async def _stats(control: str) -> dict:  # type: ignore[type-arg]
    async with aiohttp.ClientSession() as s, s.get(f"{control}/stats") as resp:
        return dict(await resp.json())


async def measure(
    services: env.KeylimeServices,
    fleet_pid: int,
    ready: dict,  # type: ignore[type-arg]
    window: float,
    ima: ImaLoad | None = None,
) -> dict[str, float]:
    api = VerifierApi(services)
    uuids = [a["uuid"] for a in ready["agents"]]
    n = len(uuids)
    verifier_pid = services.procs["verifier"].pid
    try:
        policy_s = 0.0
        if ima is not None:
            t0 = time.monotonic()
            await api.add_runtime_policy(ima.paths)
            policy_s = time.monotonic() - t0
        t0 = time.monotonic()
        for agent in ready["agents"]:  # the tenant adds agents one by one
            await api.add(agent, ready, ima is not None)
        checked = time.monotonic()
        while (await _stats(ready["control"]))["vkeys"] < n:
            if time.monotonic() - t0 > 600:
                # under IMA load keylime may never get round to every agent
                # (it parses the whole runtime policy per quote): the agents
                # it did attest are measured, its states reported
                if ima is None or not (await _stats(ready["control"]))["vkeys"]:
                    status = await api.status(uuids)
                    raise RuntimeError(f"not all agents got V: {status}")
                break
            if time.monotonic() - checked > 10:
                # keylime gives up on agents it could not reach in time (a
                # loaded machine): once every agent got V or failed, the
                # others are measured and the failed ones reported
                checked = time.monotonic()
                _, states = await api.status(uuids)
                failed = sum(v for k, v in states.items() if k in FAILED_STATES)
                if failed and (await _stats(ready["control"]))["vkeys"] + failed >= n:
                    break
            await asyncio.sleep(0.5)
        enrol_s = time.monotonic() - t0
        await asyncio.sleep(3)  # steady state
        a0, _ = await api.status(uuids)
        q0 = (await _stats(ready["control"]))["quotes"]
        c0, f0 = tree_cpu_seconds(verifier_pid), tree_cpu_seconds(fleet_pid)
        t1 = time.monotonic()
        await asyncio.sleep(window)
        q1 = (await _stats(ready["control"]))["quotes"]
        c1, f1 = tree_cpu_seconds(verifier_pid), tree_cpu_seconds(fleet_pid)
        elapsed = time.monotonic() - t1
        a1, states = await api.status(uuids)
        elapsed_a = time.monotonic() - t1
        return {
            "rate": (q1 - q0) / elapsed,
            "rate_passed": (a1 - a0) / elapsed_a,
            "verifier_cpu": (c1 - c0) / elapsed,
            "fleet_cpu": (f1 - f0) / elapsed,
            "enrol_s": enrol_s,
            "policy_s": policy_s,
            "get_quote": sum(
                states.get(s, 0) for s in (GET_QUOTE, GET_QUOTE_RETRY, PROVIDE_V)
            ),
            "failed": sum(v for k, v in states.items() if k in FAILED_STATES),
            "states": states,
        }
    finally:
        await api.session.close()


def run(
    n: int, window: float, keep: bool = False, ima: ImaLoad | None = None
) -> dict[str, float]:
    env.ensure_venv()
    workdir = tempfile.mkdtemp(prefix="bench-keylime-")
    services = env.KeylimeServices(os.path.join(workdir, "keylime"))
    fleet = None
    try:
        services.start()
        ready_file = os.path.join(workdir, "fleet-ready.json")
        cmd = [
            sys.executable,
            os.path.join(HERE, "fleet.py"),
            "--n",
            str(n),
            "--registrar",
            services.registrar_url,
            "--ca",
            os.path.join(services.cv_ca, "cacert.crt"),
            "--workdir",
            workdir,
            "--ready-file",
            ready_file,
        ]
        if ima is not None:
            cmd += ["--ima", str(ima.per_quote), "--ima-paths", str(ima.paths)]
        with open(os.path.join(workdir, "fleet.log"), "wb") as log:
            fleet = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while not os.path.exists(ready_file):
            if fleet.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"keylime fleet emulator failed; see {workdir}/fleet.log"
                )
            time.sleep(0.2)
        with open(ready_file, encoding="utf-8") as f:
            ready = json.load(f)
        result = asyncio.run(measure(services, fleet.pid, ready, window, ima))
        if keep:
            result["workdir"] = workdir  # type: ignore[assignment]
        return result
    finally:
        try:
            if fleet is not None:
                fleet.terminate()
                try:
                    fleet.wait(10)
                except subprocess.TimeoutExpired:
                    fleet.kill()
                    fleet.wait(5)
        finally:
            services.stop()
            if not keep:
                shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--keep", action="store_true", help="keep keylime's logs")
    parser.add_argument(
        "--ima", type=int, default=0, help="new IMA entries per quote (0: none)"
    )
    parser.add_argument("--ima-paths", type=int, default=100_000)
    args = parser.parse_args()
    ima = ImaLoad(args.ima, args.ima_paths) if args.ima else None
    print(json.dumps(run(args.n, args.window, args.keep, ima), indent=1, default=str))


if __name__ == "__main__":
    main()
