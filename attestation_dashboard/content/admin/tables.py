"""The operator's view: every project's nodes, the compute hosts with
their guests, the recent revocations."""

from __future__ import annotations

import dataclasses

from django.utils.translation import gettext_lazy as _
from horizon import tables

from attestation_dashboard.api import attestation as api
from attestation_dashboard.content.nodes.tables import EventColumns, NodeColumns

__all__ = ["FleetTable", "HostRow", "HostsTable", "RevocationsTable"]

#: Guests named in a host's row (the rest are counted).
MAX_GUESTS_SHOWN = 5


@dataclasses.dataclass(frozen=True)
class HostRow:
    """A host and the nodes the fleet places on it."""

    host: api.Host
    guests: tuple[str, ...]

    @property
    def id(self) -> str:  # noqa: A003
        return self.host.id

    @property
    def name(self) -> str:
        return self.host.hypervisor_hostname

    @property
    def state(self) -> str:
        return self.host.state

    @property
    def trust(self) -> str:
        trusted = self.host.trusted
        verdict = (
            "unknown" if trusted is None else "trusted" if trusted else "untrusted"
        )
        reason = self.host.failure_reason
        return f"{verdict}: {reason}" if reason else verdict

    @property
    def as_of(self) -> str:
        return self.host.as_of

    @property
    def guest_list(self) -> str:
        shown = ", ".join(self.guests[:MAX_GUESTS_SHOWN])
        more = len(self.guests) - MAX_GUESTS_SHOWN
        return f"{shown} and {more} more" if more > 0 else shown

    @property
    def guest_count(self) -> int:
        return len(self.guests)


class FleetFilter(tables.FilterAction):
    name = "filter"


class FleetTable(NodeColumns):
    project = tables.Column("project_id", verbose_name=_("Project"))

    class Meta:
        name = "fleet"
        verbose_name = _("Fleet")
        columns = ("project", *NodeColumns.base_columns)
        status_columns = ("state",)
        table_actions = (FleetFilter,)


class HostsTable(tables.DataTable):
    name = tables.Column("name", verbose_name=_("Host"))
    state = tables.Column("state", verbose_name=_("State"))
    trust = tables.Column("trust", verbose_name=_("Trust"))
    as_of = tables.Column("as_of", verbose_name=_("Verdict as of"))
    guest_count = tables.Column("guest_count", verbose_name=_("Guests"))
    guest_list = tables.Column("guest_list", verbose_name=_("Guest nodes"))

    def get_object_id(self, datum: HostRow) -> str:
        return datum.id

    class Meta:
        name = "hosts"
        verbose_name = _("Compute Hosts")


class RevocationsTable(EventColumns):
    node = tables.Column("node_uuid", verbose_name=_("Node"))

    class Meta:
        name = "revocations"
        verbose_name = _("Recent Revocations")
        columns = ("node", *EventColumns.base_columns)
