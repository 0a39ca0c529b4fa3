"""Trust traits against the real Placement 16 (issue 29 item 3): the trait
lands on and off a compute node resource provider keeping every other
trait, a concurrent writer's update is retried, a Placement outage leaves
the change pending until it is back, and an unknown provider is named."""

from __future__ import annotations

import uuid as uuid_mod

import fixtures
import testtools
from keystoneauth1 import loading as ks_loading
from oslo_config import cfg

from trusted_testing.placement import StandalonePlacement
from verifier.conf import placement as placement_conf
from verifier.placement import (
    PlacementClient,
    PlacementError,
    TraitSync,
    noauth_adapter,
)

TRAIT = "CUSTOM_ATTESTATION_TRUSTED"
NOVA_TRAITS = ["COMPUTE_SECURITY_TPM_2_0", "COMPUTE_STATUS_DISABLED", "CUSTOM_OTHER"]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _RacingClient(PlacementClient):
    """A client before whose first ``races`` writes another writer updates
    the provider (after this client read its generation)."""

    def __init__(self, placement: StandalonePlacement, races: int, attempts: int = 4):
        super().__init__(noauth_adapter(placement.url, 5.0), conflict_retries=attempts)
        self.placement = placement
        self.races = races

    def _put_traits(self, provider: str, generation: int, traits: set[str]) -> bool:
        if self.races > 0:
            self.races -= 1
            _, current = self.placement.traits(provider)
            racer = f"CUSTOM_RACER_{self.races}"
            self.placement.set_traits(provider, sorted(current | {racer}))
        return super()._put_traits(provider, generation, traits)


class PlacementTraitsTest(testtools.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls._workdir = fixtures.TempDir()
        cls._workdir.setUp()
        cls.placement = StandalonePlacement(cls._workdir.path)
        cls.placement.start()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.placement.stop()
        cls._workdir.cleanUp()
        super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        self.placement.start()  # a test may have left it stopped
        self.provider = self.placement.create_provider(
            f"compute-{uuid_mod.uuid4().hex[:8]}", NOVA_TRAITS
        )
        self.client = PlacementClient.noauth(self.placement.url, timeout=5.0)
        self.clock = _Clock()
        self.sync = TraitSync(self.client, TRAIT, retry_interval=10.0, clock=self.clock)

    def test_trait_is_added_keeping_every_other_trait(self) -> None:
        before, _ = self.placement.traits(self.provider)
        self.sync.want(self.provider, True)
        self.assertEqual({}, self.sync.pump())
        generation, traits = self.placement.traits(self.provider)
        self.assertEqual({*NOVA_TRAITS, TRAIT}, traits)
        self.assertEqual(before + 1, generation)

    def test_trait_is_removed_keeping_every_other_trait(self) -> None:
        self.placement.set_traits(self.provider, [*NOVA_TRAITS, TRAIT])
        self.sync.want(self.provider, False)
        self.assertEqual({}, self.sync.pump())
        self.assertEqual(set(NOVA_TRAITS), self.placement.traits(self.provider)[1])

    def test_steady_state_costs_no_request(self) -> None:
        self.sync.want(self.provider, True)
        self.sync.pump()
        made = self.client.requests
        for _ in range(5):
            self.sync.want(self.provider, True)
            self.sync.pump()
        self.assertEqual(made, self.client.requests)

    def test_concurrent_update_between_read_and_write_is_retried_and_lands(
        self,
    ) -> None:
        client = _RacingClient(self.placement, races=1)
        sync = TraitSync(client, TRAIT, retry_interval=10.0, clock=self.clock)
        sync.want(self.provider, True)
        self.assertEqual({}, sync.pump())
        self.assertEqual(0, client.races)
        # Read, trait creation, (race) write -> 409, read again, write.
        self.assertEqual(5, client.requests)
        traits = self.placement.traits(self.provider)[1]
        self.assertEqual({*NOVA_TRAITS, "CUSTOM_RACER_0", TRAIT}, traits)

    def test_set_trait_gives_up_after_its_attempts_on_conflict(self) -> None:
        client = _RacingClient(self.placement, races=100, attempts=3)
        with self.assertRaises(PlacementError) as ctx:
            client.set_trait(self.provider, TRAIT, True)
        self.assertEqual("placement_conflict", ctx.exception.reason)
        self.assertIn(self.provider, str(ctx.exception))
        self.assertEqual(97, client.races)
        self.assertNotIn(TRAIT, self.placement.traits(self.provider)[1])

    def test_placement_down_leaves_the_change_pending_until_it_is_back(self) -> None:
        self.placement.set_traits(self.provider, [*NOVA_TRAITS, TRAIT])
        self.placement.stop()
        log = self.useFixture(fixtures.FakeLogger(name="verifier.placement"))
        self.sync.want(self.provider, False)
        self.assertEqual({self.provider: False}, self.sync.pump())
        self.assertIn(
            f"remove trait {TRAIT} on resource provider {self.provider}", log.output
        )
        error = self.sync.errors()[self.provider]
        self.assertEqual("placement_unreachable", error.reason)
        self.assertIn(self.provider, str(error))
        self.placement.start()
        self.clock.now += 5  # not yet time to retry
        self.assertEqual({self.provider: False}, self.sync.pump())
        self.clock.now += 5
        self.assertEqual({}, self.sync.pump())
        self.assertEqual(set(NOVA_TRAITS), self.placement.traits(self.provider)[1])

    def test_trait_is_never_added_for_a_host_that_failed_meanwhile(self) -> None:
        self.placement.stop()
        self.sync.want(self.provider, True)
        self.sync.pump()  # fails: Placement is down
        self.sync.want(self.provider, False)  # the host failed in between
        self.placement.start()
        self.clock.now += 10
        self.assertEqual({}, self.sync.pump())
        self.assertEqual(set(NOVA_TRAITS), self.placement.traits(self.provider)[1])

    def test_host_failing_during_the_write_ends_without_the_trait(self) -> None:
        sync: list[TraitSync] = []

        class _FailsMidWrite(PlacementClient):
            def _put_traits(
                self, provider: str, generation: int, traits: set[str]
            ) -> bool:
                if TRAIT in traits:  # the host fails while the add is in flight
                    sync[0].want(provider, False)
                return super()._put_traits(provider, generation, traits)

        client = _FailsMidWrite(noauth_adapter(self.placement.url))
        sync.append(TraitSync(client, TRAIT, retry_interval=10.0, clock=self.clock))
        sync[0].want(self.provider, True)
        self.assertEqual({}, sync[0].pump())  # the same pump removed it
        self.assertEqual(set(NOVA_TRAITS), self.placement.traits(self.provider)[1])

    def test_provider_that_does_not_exist_is_named(self) -> None:
        missing = str(uuid_mod.uuid4())
        with self.assertRaises(PlacementError) as ctx:
            self.client.set_trait(missing, TRAIT, True)
        self.assertEqual("provider_not_found", ctx.exception.reason)
        self.assertIn(missing, str(ctx.exception))
        self.sync.want(missing, True)
        self.assertEqual({missing: True}, self.sync.pump())
        self.assertIn(missing, str(self.sync.errors()[missing]))

    def test_client_from_keystoneauth_options(self) -> None:
        # The keystoneauth path a cloud uses ([placement] auth_type ...),
        # here with the admin_token plugin Nova's test deployment uses.
        conf = cfg.ConfigOpts()
        placement_conf.register_opts(conf)
        conf([], project="trusted-cloud", default_config_files=[])
        conf.set_override("auth_type", "admin_token", "placement")
        conf.register_opts(
            ks_loading.get_auth_plugin_conf_options("admin_token"), group="placement"
        )
        conf.set_override("token", "admin", "placement")
        conf.set_override("endpoint_override", self.placement.url, "placement")
        client = PlacementClient.from_conf(conf)
        self.assertTrue(client.set_trait(self.provider, TRAIT, True))
        self.assertIn(TRAIT, self.placement.traits(self.provider)[1])
