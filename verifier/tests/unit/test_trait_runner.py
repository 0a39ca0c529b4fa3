"""The verifier's pump of the Placement trait sync
(:mod:`verifier.attest.trait_runner`): a host verdict's want is written
soon on a worker thread, a write Placement could not take is retried until
it lands, and ``[placement] trait_sync`` off builds none. The Placement
side is a recording stand-in for :class:`PlacementClient` (the real
client against the real Placement is i29-core's functional test)."""

from __future__ import annotations

import asyncio
import unittest
import uuid

from oslo_config import cfg

from verifier import conf as verifier_conf
from verifier.attest.trait_runner import TraitRunner
from verifier.cmd.verifier import build_traits
from verifier.placement import PlacementError, PlacementReason, TraitSync


class FlakyPlacement:
    """``set_trait`` fails while ``down``, else records."""

    def __init__(self) -> None:
        self.down = False
        self.writes: list[tuple[str, bool]] = []

    def set_trait(self, provider: str, trait: str, present: bool) -> bool:
        if self.down:
            raise PlacementError(
                PlacementReason.UNREACHABLE, provider, "connection refused"
            )
        self.writes.append((provider, present))
        return True


class TraitRunnerTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.placement = FlakyPlacement()
        sync = TraitSync(self.placement, retry_interval=0.05)  # type: ignore[arg-type]
        self.runner = TraitRunner(sync)
        self.task = asyncio.create_task(self.runner.run())
        self.provider = str(uuid.uuid4())

    async def asyncTearDown(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def settled(self) -> None:
        for _ in range(200):
            await asyncio.sleep(0.01)
            if not self.runner.sync.pending():
                return
        self.fail(f"never landed: {self.runner.sync.pending()}")

    async def test_a_want_is_written_soon(self) -> None:
        self.runner.want(self.provider, True)
        await self.settled()
        self.runner.want(self.provider, False)
        await self.settled()
        self.assertEqual(
            [(self.provider, True), (self.provider, False)], self.placement.writes
        )

    async def test_removal_placement_refused_is_retried_until_it_lands(self) -> None:
        self.placement.down = True
        self.runner.want(self.provider, False)
        await asyncio.sleep(0.1)
        self.assertEqual({self.provider: False}, self.runner.sync.pending())
        self.placement.down = False
        await self.settled()
        self.assertEqual([(self.provider, False)], self.placement.writes)

    async def test_a_provider_that_is_not_a_uuid_is_ignored(self) -> None:
        self.runner.want("compute-1", True)
        self.assertEqual({}, self.runner.sync.pending())


class TraitResyncTest(unittest.IsolatedAsyncioTestCase):
    async def test_a_trait_changed_behind_the_verifiers_back_is_corrected(
        self,
    ) -> None:
        placement = FlakyPlacement()
        sync = TraitSync(placement, retry_interval=0.05)  # type: ignore[arg-type]
        runner = TraitRunner(sync, resync_interval=0.2)
        task = asyncio.create_task(runner.run())
        self.addAsyncCleanup(asyncio.gather, task, return_exceptions=True)
        self.addCleanup(task.cancel)
        provider = str(uuid.uuid4())
        runner.want(provider, True)
        await asyncio.sleep(0.1)
        self.assertEqual([(provider, True)], placement.writes)
        await asyncio.sleep(0.4)  # a resync writes the wanted state again
        self.assertGreaterEqual(placement.writes.count((provider, True)), 2)
        self.assertNotIn((provider, False), placement.writes)


class BuildTraitsTest(unittest.TestCase):
    def test_trait_sync_off_builds_none(self) -> None:
        conf = cfg.ConfigOpts()
        verifier_conf.register_opts(conf)
        conf([], default_config_files=[])
        self.assertIsNone(build_traits(conf))

    def test_trait_sync_on_with_noauth_builds_a_runner(self) -> None:
        conf = cfg.ConfigOpts()
        verifier_conf.register_opts(conf)
        conf([], default_config_files=[])
        conf.set_override("trait_sync", True, "placement")
        conf.set_override("noauth", True, "placement")
        conf.set_override("endpoint_override", "http://127.0.0.1:1", "placement")
        runner = build_traits(conf)
        assert runner is not None
        self.assertEqual("CUSTOM_ATTESTATION_TRUSTED", runner.sync.trait)
