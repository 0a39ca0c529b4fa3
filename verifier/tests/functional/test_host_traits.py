"""The verifier's host verdicts drive the trust trait on the real
Placement 16 (standalone ``placement-api`` on a loopback port with
SQLite): the trait lands on an attested host's resource provider keeping
Nova's traits, goes when the host fails, and a removal while Placement is
down lands once it is back. The verifier runs in this process with the
unit suites' fake agents (SoftTpm quotes) and its real TraitSync runner.
"""

from __future__ import annotations

import asyncio
import tempfile
from typing import ClassVar

from trusted_testing.placement import StandalonePlacement
from verifier.attest.service import Verifier
from verifier.attest.trait_runner import TraitRunner
from verifier.placement import PlacementClient, TraitSync
from verifier.tests.unit.test_attest_service import FakeAgent
from verifier.tests.unit.test_hosts_service import HostCase

TRAIT = "CUSTOM_ATTESTATION_TRUSTED"
NOVA_TRAITS = ["COMPUTE_SECURITY_TPM_2_0", "CUSTOM_OTHER"]


class HostTraitsTest(HostCase):
    placement: ClassVar[StandalonePlacement]
    _dir: ClassVar[tempfile.TemporaryDirectory[str]]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls._dir = tempfile.TemporaryDirectory()
        cls.placement = StandalonePlacement(cls._dir.name)
        cls.placement.start()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.placement.stop()
        cls._dir.cleanup()
        super().tearDownClass()

    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.placement.start()  # a test may have left it stopped
        client = PlacementClient.noauth(self.placement.url, timeout=5.0)
        self.runner = TraitRunner(TraitSync(client, TRAIT, retry_interval=0.2))

    def new_verifier(self, notifiers: object = None) -> Verifier:
        verifier = super().new_verifier(notifiers)
        verifier.traits = self.runner
        verifier.host_verdicts._traits = self.runner
        return verifier

    def host_agent(self, name: str) -> FakeAgent:
        """An agent registered under a new compute node provider's UUID."""
        provider = self.placement.create_provider(name, NOVA_TRAITS)
        agent = FakeAgent(provider, next(self._ports))
        self.agents.add(agent)
        self.registrar.add(agent)
        return agent

    async def traits_become(self, provider: str, present: bool) -> set[str]:
        for _ in range(150):
            _, traits = await asyncio.to_thread(self.placement.traits, provider)
            if (TRAIT in traits) is present and not self.runner.sync.pending():
                return traits
            await asyncio.sleep(0.1)
        self.fail(f"trait never {'on' if present else 'off'}: {traits}")

    async def test_trait_follows_the_host_verdict_keeping_novas_traits(self) -> None:
        verifier = self.new_verifier()
        await verifier.start()
        self.quiesce(verifier)
        host = self.host_agent("compute-1")
        await self.enrol_host(verifier, host)
        await self.traits_become(host.uuid, False)
        await verifier.rounds.attest_once(host.uuid)
        traits = await self.traits_become(host.uuid, True)
        self.assertEqual({TRAIT, *NOVA_TRAITS}, traits)
        host.tpm.extend(16, b"unknown program")
        await verifier.rounds.attest_once(host.uuid)
        self.assertEqual(set(NOVA_TRAITS), await self.traits_become(host.uuid, False))

    async def test_removal_while_placement_is_down_lands_when_it_is_back(
        self,
    ) -> None:
        verifier = self.new_verifier()
        await verifier.start()
        self.quiesce(verifier)
        host = self.host_agent("compute-2")
        await self.enrol_host(verifier, host, "compute-2")
        await verifier.rounds.attest_once(host.uuid)
        await self.traits_become(host.uuid, True)
        await asyncio.to_thread(self.placement.stop)
        host.unreachable = True
        for _ in range(3):
            await verifier.rounds.attest_once(host.uuid)
        await asyncio.sleep(0.5)
        self.assertEqual({host.uuid: False}, self.runner.sync.pending())
        await asyncio.to_thread(self.placement.start)
        self.assertEqual(set(NOVA_TRAITS), await self.traits_become(host.uuid, False))
