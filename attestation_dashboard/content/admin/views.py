"""The operator's page: the fleet by state across projects (a chart and
a table), the verifier's counters (quote lag per class, the outbox),
the compute hosts with their trust and guests, the recent revocations."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.utils.translation import gettext_lazy as _
from horizon import tables

from attestation_dashboard import charts
from attestation_dashboard.api import attestation as api
from attestation_dashboard.content import common
from attestation_dashboard.content.admin import tables as admin_tables

__all__ = ["IndexView"]

#: Revocations listed.
RECENT = 20


class IndexView(tables.MultiTableView):
    table_classes = (
        admin_tables.FleetTable,
        admin_tables.HostsTable,
        admin_tables.RevocationsTable,
    )
    template_name = "attestation_dashboard/admin/index.html"
    page_title = _("Attestation")

    def _fleet(self) -> list[api.Node]:
        if not hasattr(self, "_nodes"):
            self._nodes: list[api.Node] = common.fetch(
                self.request, api.node_list, default=[]
            )
        return self._nodes

    def get_fleet_data(self) -> list[api.Node]:
        return self._fleet()

    def get_hosts_data(self) -> list[admin_tables.HostRow]:
        hosts = common.fetch(self.request, api.host_list, default=[])
        guests: dict[str, list[str]] = {}
        for node in self._fleet():
            if node.host_name:
                guests.setdefault(node.host_name, []).append(node.uuid)
        return [
            admin_tables.HostRow(
                h, tuple(sorted(guests.get(h.hypervisor_hostname, [])))
            )
            for h in hosts
        ]

    def get_revocations_data(self) -> list[api.Event]:
        return common.fetch(
            self.request, api.event_list, None, "revoked", RECENT, default=[]
        )

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        nodes = self._fleet()
        stats: Mapping[str, Any] = common.fetch(self.request, api.stats, default={})
        counts = stats.get("states")
        if not isinstance(counts, Mapping):  # the API's, else the list's
            counts = charts.count_states(n.state for n in nodes)
        context["state_chart"] = charts.state_bars(counts)
        context["stats"] = stats
        context["classes"] = stats.get("classes") or []
        context["outbox"] = stats.get("outbox")
        return context
