"""The project's nodes, and a node's events (Horizon DataTables)."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext_lazy
from horizon import tables

from attestation_dashboard.api import attestation as api

__all__ = ["EventColumns", "EventsTable", "NodeColumns", "NodesTable", "policy_rule"]

#: States a node does not leave (nothing more to revoke).
FINAL_STATES = frozenset({"revoked", "host_untrusted"})


def policy_rule(action: str) -> tuple[tuple[str, str], ...]:
    """The dashboard's policy check of the API's rule ``action`` (the same
    oslo.policy rules: attestation_dashboard/conf/attestation_policy.yaml)."""
    return (("attestation", f"attestation:{action}"),)


class ChangePolicy(tables.LinkAction):
    name = "change_policy"
    verbose_name = _("Change Policy")
    url = "horizon:project:attestation_nodes:change_policy"
    classes = ("ajax-modal",)
    icon = "pencil"
    policy_rules = policy_rule("node:set_policy")

    def allowed(self, request: Any, datum: Any = None) -> bool:
        return datum is None or datum.state not in FINAL_STATES


class RevokeNode(tables.BatchAction):
    name = "revoke"
    action_type = "danger"
    help_text = _(
        "A revoked node gets no more secrets: every hook (Vault, Puppet, "
        "IPsec) cuts it off. This cannot be undone."
    )
    policy_rules = policy_rule("node:revoke")

    @staticmethod
    def action_present(count: int) -> str:
        return ngettext_lazy("Revoke Node", "Revoke Nodes", count)

    @staticmethod
    def action_past(count: int) -> str:
        return ngettext_lazy("Revoked Node", "Revoked Nodes", count)

    def allowed(self, request: Any, datum: Any = None) -> bool:
        return datum is None or datum.state not in FINAL_STATES

    def action(self, request: Any, obj_id: str) -> None:
        who = getattr(request.user, "username", "") or "a user"
        api.revoke_node(request, obj_id, f"revoked from the dashboard by {who}")


class DeleteNode(tables.DeleteAction):
    policy_rules = policy_rule("node:delete")
    help_text = _("The verifier stops attesting the node and forgets it.")

    @staticmethod
    def action_present(count: int) -> str:
        return ngettext_lazy("Delete Node", "Delete Nodes", count)

    @staticmethod
    def action_past(count: int) -> str:
        return ngettext_lazy("Deleted Node", "Deleted Nodes", count)

    def delete(self, request: Any, obj_id: str) -> None:
        api.delete_node(request, obj_id)


class NodesFilter(tables.FilterAction):
    name = "filter"


STATE_STATUS = (
    ("attested", True),
    ("recovered", True),
    ("failed", False),
    ("revoked", False),
    ("host_untrusted", False),
    ("unreachable", False),
)


class NodeColumns(tables.DataTable):
    """The columns of a node, as the project's and the operator's tables
    show it (Horizon's tables take the columns of their bases first)."""

    uuid = tables.Column(
        "uuid", verbose_name=_("Node"), link="horizon:project:attestation_nodes:detail"
    )
    state = tables.Column(
        "state", verbose_name=_("State"), status=True, status_choices=STATE_STATUS
    )
    mode = tables.Column("mode", verbose_name=_("Mode"))
    last_good = tables.Column("last_good", verbose_name=_("Last good quote"))
    policy = tables.Column("policy", verbose_name=_("Policy in force"))
    host_trust = tables.Column("host_trust", verbose_name=_("Host trust"))

    def get_object_id(self, datum: api.Node) -> str:
        return datum.uuid


class NodesTable(NodeColumns):
    def get_object_display(self, datum: api.Node) -> str:
        return datum.uuid

    class Meta:
        name = "nodes"
        verbose_name = _("Attested Nodes")
        status_columns = ("state",)
        table_actions = (NodesFilter, RevokeNode, DeleteNode)
        row_actions = (ChangePolicy, RevokeNode, DeleteNode)


class EventColumns(tables.DataTable):
    """The columns of an event, as a node's events and the operator's
    revocations show it."""

    reason = tables.Column("reason", verbose_name=_("Reason"))
    detail = tables.Column("detail", verbose_name=_("Detail"))
    time = tables.Column("time", verbose_name=_("Time"))

    def get_object_id(self, datum: api.Event) -> str:
        return datum.id


class EventsTable(EventColumns):
    type = tables.Column("type", verbose_name=_("Type"))  # noqa: A003

    class Meta:
        name = "events"
        verbose_name = _("Events")
        columns = ("type", *EventColumns.base_columns)
