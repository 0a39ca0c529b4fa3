"""The project's nodes: the table with a chart of counts by state, a
node's page, the change-policy form."""

from __future__ import annotations

from typing import Any

from django.urls import reverse, reverse_lazy
from django.utils.translation import gettext_lazy as _
from horizon import forms, tables, tabs

from attestation_dashboard import charts
from attestation_dashboard.api import attestation as api
from attestation_dashboard.content import common
from attestation_dashboard.content.nodes import forms as node_forms
from attestation_dashboard.content.nodes import tables as node_tables
from attestation_dashboard.content.nodes import tabs as node_tabs

__all__ = ["ChangePolicyView", "DetailView", "IndexView"]


class IndexView(tables.DataTableView):
    table_class = node_tables.NodesTable
    template_name = "attestation_dashboard/nodes/index.html"
    page_title = _("Attested Nodes")

    def get_data(self) -> list[api.Node]:
        nodes: list[api.Node] = common.fetch(self.request, api.node_list, default=[])
        self._nodes = nodes
        return nodes

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        nodes = getattr(self, "_nodes", [])
        context["state_chart"] = charts.state_bars(
            charts.count_states(n.state for n in nodes)
        )
        return context


def _node(request: Any, uuid: str) -> api.Node | None:
    """The node (Http404 if the API does not know it for this user; None
    when the API cannot be reached, said on the page)."""
    return common.fetch(request, api.node_get, uuid, default=None)


class DetailView(tabs.TabView):
    tab_group_class = node_tabs.NodeTabs
    template_name = "horizon/common/_detail.html"
    page_title = _("Node {{ node_id }}")

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        node = _node(self.request, kwargs["node_id"])
        self._node_found = node
        context = super().get_context_data(**kwargs)
        context["node"] = node
        context["node_id"] = kwargs["node_id"]
        context["url"] = reverse("horizon:project:attestation_nodes:index")
        if node is not None:
            table = node_tables.NodesTable(self.request)
            context["actions"] = table.render_row_actions(node)
        return context

    def get_tabs(self, request: Any, **kwargs: Any) -> Any:
        return self.tab_group_class(request, node=self._node_found, **kwargs)


class ChangePolicyView(forms.ModalFormView):
    form_class = node_forms.ChangePolicyForm
    template_name = "attestation_dashboard/nodes/change_policy.html"
    modal_id = "change_policy_modal"
    modal_header = _("Change Policy")
    submit_label = _("Change Policy")
    page_title = _("Change Policy")
    success_url = reverse_lazy("horizon:project:attestation_nodes:index")

    def _get_node(self) -> api.Node | None:
        if not hasattr(self, "_found"):
            self._found = _node(self.request, self.kwargs["node_id"])
        return self._found

    def get_form_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = super().get_form_kwargs()
        kwargs["versions"] = common.fetch(self.request, api.policy_list, default=[])
        return kwargs

    def get_initial(self) -> dict[str, Any]:
        return {"node_id": self.kwargs["node_id"]}

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        node_id = self.kwargs["node_id"]
        context["node"] = self._get_node()
        context["submit_url"] = reverse(
            "horizon:project:attestation_nodes:change_policy", args=[node_id]
        )
        return context
