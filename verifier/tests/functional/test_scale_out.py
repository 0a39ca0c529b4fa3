"""Scale-out: three verifier processes share PostgreSQL and split an
emulated fleet with tooz on Redis. Killing one hands its nodes to the
others within two quote intervals; a revocation is never duplicated.
"""

from __future__ import annotations

import time

from trusted_testing.cluster import wait_until
from trusted_testing.shared_fleet import SharedDbFleetCase

INTERVAL = 3.0
MEMBERSHIP_TIMEOUT = 2.0  # heartbeats slip on a loaded 2-core machine
NODES = 30


class ScaleOutTest(SharedDbFleetCase):
    NAME = "scale-out"
    VERIFIERS = 3
    NODES = NODES
    INTERVAL = INTERVAL
    MEMBERSHIP_TIMEOUT = MEMBERSHIP_TIMEOUT

    def stats(self, index: int) -> dict:  # type: ignore[type-arg]
        url = self.cluster.verifier_urls[index]
        # the counters cover every project: the operator's (service) view
        session = self._session("operator")
        return dict(session.get(f"{url}/v1/stats", timeout=10).json())

    def node(self, uuid: str, index: int = 0) -> dict:  # type: ignore[type-arg]
        url = self.cluster.verifier_urls[index]
        return dict(self._session().get(f"{url}/v1/nodes/{uuid}", timeout=10).json())

    def events(self, uuid: str, index: int = 0) -> list:  # type: ignore[type-arg]
        url = self.cluster.verifier_urls[index]
        resp = self._session().get(
            f"{url}/v1/events", params={"node": uuid}, timeout=10
        )
        return list(resp.json()["events"])

    def test_1_nodes_are_split_and_all_attested(self) -> None:
        attested = wait_until(
            lambda: self.stats(0)["states"]["attested"] == NODES, 60, step=0.5
        )
        self.assertTrue(attested, self.stats(0))
        # ownership converges within a few syncs of the last member joining
        converged = wait_until(
            lambda: sum(self.stats(i)["owned"] for i in range(3)) == NODES, 10
        )
        owned = [self.stats(i)["owned"] for i in range(3)]
        self.assertTrue(converged, owned)
        self.assertTrue(all(o > 0 for o in owned), owned)
        # every node is being quoted, by exactly one verifier at a time
        before = self.fleet.counters()
        time.sleep(INTERVAL * 1.5)
        after = self.fleet.counters()
        for uuid in self.fleet.uuids:
            self.assertIn(after[uuid] - before[uuid], (1, 2), uuid)

    def test_2_killed_verifier_hands_over_within_two_intervals(self) -> None:
        wait_until(lambda: self.stats(0)["states"]["attested"] == NODES, 60, step=0.5)
        self.cluster.kill_verifier(1)
        killed = time.monotonic()
        base = self.fleet.counters()
        fresh: dict[str, float] = {}
        while len(fresh) < NODES and time.monotonic() - killed < 4 * INTERVAL:
            counts = self.fleet.counters()
            now = time.monotonic()
            for uuid in self.fleet.uuids:
                if uuid not in fresh and counts[uuid] > base[uuid]:
                    fresh[uuid] = now - killed
            time.sleep(0.1)
        self.assertEqual(NODES, len(fresh), "some nodes were never quoted again")
        worst = max(fresh.values())
        self.assertLessEqual(worst, 2 * INTERVAL, f"worst gap {worst:.2f} s")
        converged = wait_until(
            lambda: sum(self.stats(i)["owned"] for i in (0, 2)) == NODES, 10
        )
        self.assertTrue(converged, [self.stats(i)["owned"] for i in (0, 2)])

    def test_3_revocation_happens_once_whoever_sees_it(self) -> None:
        wait_until(lambda: self.stats(0)["states"]["attested"] >= NODES - 1, 60)
        victim = self.fleet.uuids[0]
        self.fleet.tamper(victim)
        revoked = wait_until(
            lambda: self.node(victim)["state"] == "revoked", 3 * INTERVAL, step=0.2
        )
        self.assertTrue(revoked, self.node(victim))
        self.assertTrue(self.node(victim)["failure_reason"].startswith("pcr_policy"))
        time.sleep(2 * INTERVAL)  # let every verifier have its chance
        self.assertEqual(1, len(self.events(victim)))
        delivered = wait_until(
            lambda: all(e["delivered"] for e in self.events(victim)), 10
        )
        self.assertTrue(delivered)

    def test_4_tenant_revoke_through_a_non_owner_stops_the_owner(self) -> None:
        victim = self.fleet.uuids[1]
        owners = [i for i in (0, 2) if self.node(victim, i)["state"] != "revoked"]
        self.assertTrue(owners)
        url = self.cluster.verifier_urls[0]
        session = self._session()
        for _ in range(2):  # twice, through whichever verifier: one event
            resp = session.post(f"{url}/v1/nodes/{victim}/revoke", json={}, timeout=10)
            self.assertEqual(200, resp.status_code, resp.text)
        # every verifier sees it within a sync interval (0.2 s)
        for index in (0, 2):
            seen = wait_until(
                lambda i=index: self.node(victim, i)["state"] == "revoked", 2
            )
            self.assertTrue(seen, index)
        before = self.fleet.counters()[victim]
        time.sleep(2 * INTERVAL)
        self.assertEqual(before, self.fleet.counters()[victim])
        self.assertEqual(1, len(self.events(victim)))
