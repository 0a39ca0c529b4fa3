"""A node's page: overview, events, history (a timeline)."""

from __future__ import annotations

import time
from typing import Any

from django.utils.translation import gettext_lazy as _
from horizon import tabs

from attestation_dashboard import charts
from attestation_dashboard.api import attestation as api
from attestation_dashboard.content import common
from attestation_dashboard.content.nodes.tables import EventsTable

__all__ = ["NodeTabs"]


class OverviewTab(tabs.Tab):
    name = _("Overview")
    slug = "overview"
    template_name = "attestation_dashboard/nodes/_overview.html"

    def get_context_data(self, request: Any, **kwargs: Any) -> dict[str, Any]:
        return {"node": self.tab_group.kwargs.get("node")}


class EventsTab(tabs.TableTab):
    name = _("Events")
    slug = "events"
    table_classes = (EventsTable,)
    template_name = "horizon/common/_detail_table.html"

    def get_events_data(self) -> list[api.Event]:
        uuid = self.tab_group.kwargs["node_id"]
        return common.fetch(self.request, api.event_list, uuid, default=[])


class HistoryTab(tabs.Tab):
    name = _("History")
    slug = "history"
    template_name = "attestation_dashboard/nodes/_history.html"

    def get_context_data(self, request: Any, **kwargs: Any) -> dict[str, Any]:
        uuid = self.tab_group.kwargs["node_id"]
        # a node with no entry in the log yet is 404 there: no history
        entries = common.fetch(
            request, api.node_history, uuid, default=[], empty_if_missing=True
        )
        return {
            "entries": list(reversed(entries)),
            "timeline": charts.timeline(entries, time.time()),
        }


class NodeTabs(tabs.TabGroup):
    slug = "node_details"
    tabs = (OverviewTab, EventsTab, HistoryTab)
    sticky = True
