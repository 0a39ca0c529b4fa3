"""Compute hosts in the verifier service (trusted compute pools, issue 29),
hermetically: hosts and guests are fake agents over SoftTpm (real quotes)
as in :mod:`verifier.tests.unit.test_attest_service`; the registrar's
trust endpoint and the Placement trait sync are recording fakes.

Enrolment (no V: attested from the first good quote), the refusals of a
second claim, hosts kept out of every tenant's view, a host found
untrusted marking its guests ``host_untrusted`` with signed events, an
unreachable host marking none, the trait and the registrar's trust
following the verdict (and stated again at start).
"""

from __future__ import annotations

import json
import os
from typing import Any

from verifier.attest.host_verdicts import RegistrarTrust
from verifier.attest.service import Verifier
from verifier.exceptions import ConflictError, NotFoundError, RequestError
from verifier.protocol import SignedEvent
from verifier.protocol.messages.host_trust import HostTrustUpdate
from verifier.protocol.messages.hosts import HostEnrolmentRequest
from verifier.tests.unit.test_attest_service import (
    FakeAgent,
    FakeRegistrar,
    VerifierServiceBase,
)


class TrustRegistrar(FakeRegistrar):
    """Records the hosts' trust reports; ``down`` refuses them."""

    def __init__(self) -> None:
        super().__init__()
        self.trust: list[tuple[str, HostTrustUpdate]] = []
        self.down = False

    async def put_host_trust(self, host: str, report: HostTrustUpdate) -> None:
        if self.down:
            raise RequestError("registrar_unreachable", "refused", 502)
        self.trust.append((host, report))


class RecordingTraits:
    """Stands in for TraitSync: the trait wanted on each provider."""

    def __init__(self) -> None:
        self.wanted: list[tuple[str, bool]] = []

    def want(self, provider: str, trusted: bool) -> None:
        self.wanted.append((provider, trusted))

    def last(self, provider: str) -> bool | None:
        found = [t for p, t in self.wanted if p == provider]
        return found[-1] if found else None


class HostCase(VerifierServiceBase):
    """A verifier with a trait recorder and a trust-recording registrar."""

    def setUp(self) -> None:
        super().setUp()
        self.registrar = TrustRegistrar()
        self.traits = RecordingTraits()

    def new_verifier(self, notifiers: Any = None) -> Verifier:
        verifier = super().new_verifier(notifiers)
        verifier.host_verdicts._traits = self.traits
        return verifier

    async def enrol_host(
        self, verifier: Verifier, agent: FakeAgent, name: str = "compute-1"
    ) -> None:
        request = HostEnrolmentRequest(agent.uuid, name, self.policy)
        view = await verifier.hosts.enrol(request, "admin-project")
        self.quiesce(verifier)
        self.assertEqual("registered", view.state)
        self.assertIsNone(view.trusted)

    async def attested_guest(
        self, verifier: Verifier, host: str = "compute-1", project: str = "p1"
    ) -> FakeAgent:
        guest = self.new_agent()
        await verifier.commands.enrol(
            guest.uuid, os.urandom(32), self.policy, project=project
        )
        self.quiesce(verifier)
        self.assertTrue(verifier.host_store.place(guest.uuid, host))
        view = await verifier.rounds.attest_once(guest.uuid)
        self.assertEqual("attested", view.state)
        return guest

    def events_of(self, uuid: str) -> list[tuple[str, str]]:
        out = []
        for row in self.outbox_rows():
            event = SignedEvent.from_dict(json.loads(row.body)).verify(self.public_key)
            if event.node_uuid == uuid:
                out.append((event.type, event.reason))
        return out


class HostEnrolmentTest(HostCase):
    async def test_host_enrolled_without_v_is_attested_on_first_good_quote(
        self,
    ) -> None:
        verifier = self.new_verifier()
        host = self.new_agent()
        await self.enrol_host(verifier, host)
        row = self.row(host.uuid)
        assert row is not None
        self.assertEqual(("host", "", b""), (row.kind, row.project_id, row.v_share))
        await verifier.rounds.attest_once(host.uuid)
        (view,) = await verifier.hosts.list()
        self.assertEqual(("attested", True), (view.state, view.trusted))
        self.assertEqual("0", host.quote_requests[0]["csr"])  # no identity, no V
        self.assertEqual([], host.v_posts)
        self.assertEqual([], self.outbox_rows())

    async def test_second_claim_of_provider_is_refused_naming_it(self) -> None:
        verifier = self.new_verifier()
        host = self.new_agent()
        await self.enrol_host(verifier, host)
        with self.assertRaises(ConflictError) as ctx:
            await self.enrol_host(verifier, host, "compute-2")
        self.assertEqual("provider_claimed", ctx.exception.code)
        self.assertEqual(
            ["compute-1"], [h.hypervisor_hostname for h in await verifier.hosts.list()]
        )

    async def test_second_claim_of_hypervisor_name_is_refused_naming_it(self) -> None:
        verifier = self.new_verifier()
        await self.enrol_host(verifier, self.new_agent())
        with self.assertRaises(ConflictError) as ctx:
            await self.enrol_host(verifier, self.new_agent(), "compute-1")
        self.assertEqual("hypervisor_claimed", ctx.exception.code)
        self.assertIn("compute-1", ctx.exception.detail)
        self.assertEqual(1, len(await verifier.hosts.list()))

    async def test_second_claim_of_tpm_is_refused_naming_it(self) -> None:
        verifier = self.new_verifier()
        first = self.new_agent()
        await self.enrol_host(verifier, first)
        other = self.new_agent()
        other.tpm = first.tpm  # the same TPM registered under a second provider
        self.registrar.add(other)
        with self.assertRaises(ConflictError) as ctx:
            await self.enrol_host(verifier, other, "compute-2")
        self.assertEqual("tpm_claimed", ctx.exception.code)
        self.assertIsNone(self.row(other.uuid))

    async def test_a_guest_node_uuid_cannot_be_claimed_as_a_host(self) -> None:
        verifier = self.new_verifier()
        guest = self.new_agent()
        await self.enrol(verifier, guest)
        with self.assertRaises(ConflictError) as ctx:
            await self.enrol_host(verifier, guest)
        self.assertEqual("provider_claimed", ctx.exception.code)

    async def test_unknown_policy_is_404_and_nothing_stored(self) -> None:
        verifier = self.new_verifier()
        host = self.new_agent()
        request = HostEnrolmentRequest(
            host.uuid, "compute-1", self.policy, runtime_policy="no-such"
        )
        with self.assertRaises(NotFoundError):
            await verifier.hosts.enrol(request, "admin-project")
        self.assertIsNone(self.row(host.uuid))
        self.assertEqual([], await verifier.hosts.list())

    async def test_hosts_are_in_no_tenant_listing_node_read_or_stats(self) -> None:
        verifier = self.new_verifier()
        host = self.new_agent()
        await self.enrol_host(verifier, host)
        await verifier.rounds.attest_once(host.uuid)
        guest = await self.attested_guest(verifier)
        self.assertEqual([guest.uuid], [v.uuid for v in await verifier.queries.list()])
        self.assertEqual([], await verifier.queries.list(""))
        for scope in (None, "", "p1"):
            with self.assertRaises(NotFoundError):
                await verifier.queries.get(host.uuid, scope)
        with self.assertRaises(NotFoundError):  # not deletable as a node
            await verifier.commands.delete(host.uuid)
        self.assertIsNotNone(self.row(host.uuid))
        stats = await verifier.queries.stats()
        self.assertEqual(1, stats["nodes"])

    async def test_show_lists_the_hosts_guests_and_delete_forgets_it(self) -> None:
        verifier = self.new_verifier()
        host = self.new_agent()
        await self.enrol_host(verifier, host)
        await verifier.rounds.attest_once(host.uuid)
        guest = await self.attested_guest(verifier)
        view = await verifier.hosts.get("compute-1")
        self.assertEqual((guest.uuid,), view.guests)
        self.assertEqual(view, await verifier.hosts.get(host.uuid.upper()))
        await verifier.hosts.delete("compute-1")
        self.assertIsNone(self.row(host.uuid))
        self.assertFalse(self.traits.last(host.uuid))
        with self.assertRaises(NotFoundError):
            await verifier.hosts.get("compute-1")
        guest_view = await verifier.queries.get(guest.uuid)
        self.assertEqual("attested", guest_view.state)  # deletion is no evidence


class HostVerdictTest(HostCase):
    async def test_guest_status_carries_its_hosts_verdict(self) -> None:
        verifier = self.new_verifier()
        host = self.new_agent()
        await self.enrol_host(verifier, host)
        await verifier.rounds.attest_once(host.uuid)
        guest = await self.attested_guest(verifier)
        shown = (await verifier.queries.get(guest.uuid, "p1")).to_dict()
        self.assertEqual("compute-1", shown["host"]["name"])
        self.assertIs(True, shown["host"]["trusted"])
        self.assertTrue(shown["host"]["as_of"].endswith("Z"))

    async def test_host_failing_evidence_marks_each_guest_host_untrusted(
        self,
    ) -> None:
        verifier = self.new_verifier()
        host = self.new_agent()
        await self.enrol_host(verifier, host)
        await verifier.rounds.attest_once(host.uuid)
        guests = [await self.attested_guest(verifier) for _ in range(2)]
        elsewhere = await self.attested_guest(verifier, host="compute-2")
        host.tpm.extend(16, b"unknown program")  # the host runs something new
        await verifier.rounds.attest_once(host.uuid)
        (view,) = await verifier.hosts.list()
        self.assertEqual(("revoked", False), (view.state, view.trusted))
        for guest in guests:
            shown = (await verifier.queries.get(guest.uuid, "p1")).to_dict()
            self.assertEqual("host_untrusted", shown["state"])
            self.assertIs(False, shown["host"]["trusted"])
            self.assertEqual(
                [("node.host_untrusted", "host_untrusted")], self.events_of(guest.uuid)
            )
            row = self.row(guest.uuid)
            assert row is not None
            self.assertEqual("revoked", row.state)  # final, as a revocation
        self.assertEqual("attested", (await verifier.queries.get(elsewhere.uuid)).state)
        self.assertFalse(self.traits.last(host.uuid))
        # the host's own event is the operator's: no project
        host_rows = [r for r in self.outbox_rows() if r.node_uuid == host.uuid]
        self.assertEqual([""], [r.project_id for r in host_rows])
        self.assertEqual(
            ["p1", "p1"],
            sorted(
                r.project_id
                for r in self.outbox_rows()
                if r.node_uuid in {g.uuid for g in guests}
            ),
        )

    async def test_unreachable_host_loses_its_trait_but_marks_no_guest(self) -> None:
        verifier = self.new_verifier()
        host = self.new_agent()
        await self.enrol_host(verifier, host)
        await verifier.rounds.attest_once(host.uuid)
        self.assertTrue(self.traits.last(host.uuid))
        guest = await self.attested_guest(verifier)
        host.unreachable = True
        for _ in range(3):  # max_unreachable
            await verifier.rounds.attest_once(host.uuid)
        (view,) = await verifier.hosts.list()
        self.assertEqual(("unreachable", None), (view.state, view.trusted))
        self.assertFalse(self.traits.last(host.uuid))
        shown = (await verifier.queries.get(guest.uuid)).to_dict()
        self.assertEqual("attested", shown["state"])
        self.assertIsNone(shown["host"]["trusted"])
        self.assertEqual([], self.events_of(guest.uuid))
        host.unreachable = False  # back: trusted again, trait again
        await verifier.rounds.attest_once(host.uuid)
        self.assertTrue(self.traits.last(host.uuid))

    async def test_trust_reported_to_registrar_and_retried_until_it_lands(
        self,
    ) -> None:
        verifier = self.new_verifier()
        host = self.new_agent()
        self.registrar.down = True
        await self.enrol_host(verifier, host)
        await verifier.rounds.attest_once(host.uuid)
        trust: RegistrarTrust = verifier.host_trust
        await trust.pump()
        self.assertEqual([], self.registrar.trust)
        self.assertTrue(trust.pending()["compute-1"].trusted)
        self.registrar.down = False
        await trust.pump()
        self.assertEqual({}, trust.pending())
        ((name, report),) = self.registrar.trust  # only the latest is sent
        self.assertEqual(
            ("compute-1", True, host.uuid), (name, report.trusted, report.provider)
        )
        self.assertIsNone(report.ca_sha256)

    async def test_verdicts_are_stated_again_at_start(self) -> None:
        verifier = self.new_verifier()
        host = self.new_agent()
        await self.enrol_host(verifier, host)
        await verifier.rounds.attest_once(host.uuid)
        await verifier.stop()
        self.verifiers.remove(verifier)
        self.traits.wanted.clear()
        restarted = self.new_verifier()
        await restarted.start()
        self.quiesce(restarted)
        self.assertEqual([(host.uuid, True)], self.traits.wanted)
        await restarted.host_trust.pump()
        self.assertEqual(
            [("compute-1", True)], [(n, r.trusted) for n, r in self.registrar.trust]
        )


class GuestPlacementTest(HostCase):
    async def test_node_enrolled_after_its_instance_learns_its_host_at_enrolment(
        self,
    ) -> None:
        verifier = self.new_verifier()
        guest = self.new_agent()
        self.registrar.placements[guest.uuid] = "compute-7"
        await self.enrol(verifier, guest)
        row = self.row(guest.uuid)
        assert row is not None
        self.assertEqual("compute-7", row.compute_host)
        shown = (await verifier.queries.get(guest.uuid)).to_dict()
        self.assertEqual(
            {"name": "compute-7", "trusted": None, "as_of": None}, shown["host"]
        )

    async def test_node_without_a_known_host_shows_none(self) -> None:
        verifier = self.new_verifier()
        guest = self.new_agent()
        await self.enrol(verifier, guest)
        self.assertIsNone((await verifier.queries.get(guest.uuid)).to_dict()["host"])


class HostGaugeTest(HostCase):
    async def test_hosts_gauge_counts_hosts_by_verdict_and_nodes_leave_them_out(
        self,
    ) -> None:
        from verifier.common import metrics

        def hosts(state: str) -> float | None:
            return metrics.REGISTRY.get_sample_value(
                "trusted_cloud_hosts", {"state": state}
            )

        verifier = self.new_verifier()
        good, bad, silent = self.new_agent(), self.new_agent(), self.new_agent()
        for agent, name in ((good, "c1"), (bad, "c2"), (silent, "c3")):
            await self.enrol_host(verifier, agent, name)
            await verifier.rounds.attest_once(agent.uuid)
        bad.tpm.extend(16, b"unknown program")
        await verifier.rounds.attest_once(bad.uuid)
        silent.unreachable = True
        for _ in range(3):
            await verifier.rounds.attest_once(silent.uuid)
        await verifier.gauges.refresh()
        self.assertEqual(
            (1.0, 1.0, 1.0), (hosts("trusted"), hosts("untrusted"), hosts("unknown"))
        )
        nodes = metrics.REGISTRY.get_sample_value(
            "trusted_cloud_nodes", {"state": "attested", "mode": "pull"}
        )
        self.assertEqual(0.0, nodes)


class SharedHostsTest(HostCase):
    async def test_host_enrolled_through_another_verifier_marks_its_guests(
        self,
    ) -> None:
        other = self.new_verifier()
        await other.start()
        self.quiesce(other)
        verifier = self.new_verifier()  # enrols; `other` adopts and attests
        host = self.new_agent()
        await self.enrol_host(verifier, host)
        guest = await self.attested_guest(verifier)
        await other.sync.sync()
        await other.rounds.attest_once(host.uuid)
        self.assertIs(True, (await other.hosts.get("compute-1")).trusted)
        host.tpm.extend(16, b"unknown program")
        await other.rounds.attest_once(host.uuid)
        shown = (await other.queries.get(guest.uuid)).to_dict()
        self.assertEqual("host_untrusted", shown["state"])
        self.assertEqual(
            [("node.host_untrusted", "host_untrusted")], self.events_of(guest.uuid)
        )

    async def test_guest_placed_through_another_verifier_is_batched(self) -> None:
        verifier = self.new_verifier()
        host = self.new_agent()
        await self.enrol_host(verifier, host)
        await verifier.rounds.attest_once(host.uuid)
        guest = await self.attested_guest(verifier)  # placed in the table only
        await verifier.rounds.attest_once(guest.uuid)
        await verifier.rounds.attest_once(host.uuid)  # learns where it runs
        await verifier.rounds.attest_once(guest.uuid)
        await verifier.rounds.attest_once(host.uuid)
        self.assertEqual(1, verifier.host_batches.rounds[host.uuid].size)
        self.assertIn(guest.uuid, verifier.host_batches.proofs)


class HostMetricsTest(HostCase):
    async def test_marked_guests_count_as_host_untrusted_transitions(self) -> None:
        from verifier.common import metrics

        def marked() -> float | None:
            return metrics.REGISTRY.get_sample_value(
                "trusted_cloud_node_transitions_total",
                {"kind": "host_untrusted", "reason": "host_untrusted"},
            )

        before = marked()
        self.assertIsNotNone(before)  # the series exists from the start
        verifier = self.new_verifier()
        host = self.new_agent()
        await self.enrol_host(verifier, host)
        await verifier.rounds.attest_once(host.uuid)
        await self.attested_guest(verifier)
        host.tpm.extend(16, b"unknown program")
        await verifier.rounds.attest_once(host.uuid)
        assert before is not None
        self.assertEqual(before + 1, marked())


class HostUntrustedLogTest(HostCase):
    async def test_marked_guest_has_a_host_untrusted_entry_in_the_log(self) -> None:
        verifier = self.new_verifier()
        host = self.new_agent()
        await self.enrol_host(verifier, host)
        await verifier.rounds.attest_once(host.uuid)
        guest = await self.attested_guest(verifier)
        host.tpm.extend(16, b"unknown program")
        await verifier.rounds.attest_once(host.uuid)
        verifier.log_pump.pass_once()
        history = verifier.log.history(guest.uuid, "p1")
        kinds = [item.entry.kind.value for item in history.entries]
        self.assertEqual(["attested", "host_untrusted"], kinds)
        with self.assertRaises(NotFoundError):  # the host's are the operator's
            verifier.log.history(host.uuid, "p1")
