"""The project's policies (one row per kind and name) and one name's
versions."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from django.urls import reverse
from django.utils.translation import gettext_lazy as _
from horizon import tables

from attestation_dashboard.api import attestation as api
from attestation_dashboard.content.nodes.tables import policy_rule

__all__ = ["PoliciesTable", "PolicyRow", "VersionsTable", "rows_of"]


@dataclasses.dataclass(frozen=True)
class PolicyRow:
    """A policy name of one kind with its versions."""

    kind: str
    name: str
    versions: tuple[api.PolicyVersion, ...]

    @property
    def id(self) -> str:  # noqa: A003
        return f"{self.kind}:{self.name}"

    @property
    def latest(self) -> api.PolicyVersion:
        return self.versions[-1]

    @property
    def latest_version(self) -> str:
        return "" if self.latest.version is None else str(self.latest.version)

    @property
    def version_list(self) -> str:
        return ", ".join(str(v.version) for v in self.versions if v.version is not None)

    @property
    def entries(self) -> str:
        return "" if self.latest.entries is None else str(self.latest.entries)

    @property
    def created_at(self) -> str:
        return self.latest.created_at


def rows_of(versions: Iterable[api.PolicyVersion]) -> list[PolicyRow]:
    """One row per (kind, name), its versions oldest first."""
    groups: dict[tuple[str, str], list[api.PolicyVersion]] = {}
    for v in versions:
        groups.setdefault((v.kind, v.name), []).append(v)
    return [
        PolicyRow(kind, name, tuple(sorted(vs, key=lambda v: v.version or 0)))
        for (kind, name), vs in sorted(groups.items())
    ]


class UploadPolicy(tables.LinkAction):
    name = "upload"
    verbose_name = _("Upload Policy")
    url = "horizon:project:attestation_policies:upload"
    classes = ("ajax-modal",)
    icon = "upload"
    policy_rules = policy_rule("policy:create")


class PoliciesFilter(tables.FilterAction):
    name = "filter"


def _detail_url(row: PolicyRow) -> str:
    return reverse(
        "horizon:project:attestation_policies:detail", args=[row.kind, row.name]
    )


class PoliciesTable(tables.DataTable):
    name = tables.Column("name", verbose_name=_("Name"), link=_detail_url)
    kind = tables.Column("kind", verbose_name=_("Kind"))
    latest_version = tables.Column("latest_version", verbose_name=_("Latest version"))
    version_list = tables.Column("version_list", verbose_name=_("Versions"))
    entries = tables.Column("entries", verbose_name=_("Entries (latest)"))
    created_at = tables.Column("created_at", verbose_name=_("Latest stored"))

    def get_object_id(self, datum: PolicyRow) -> str:
        return datum.id

    def get_object_display(self, datum: PolicyRow) -> str:
        return datum.id

    class Meta:
        name = "policies"
        verbose_name = _("Policies")
        table_actions = (PoliciesFilter, UploadPolicy)


def _version_url(datum: api.PolicyVersion) -> str:
    url = reverse(
        "horizon:project:attestation_policies:detail", args=[datum.kind, datum.name]
    )
    return f"{url}?version={datum.version}"


class VersionsTable(tables.DataTable):
    version = tables.Column("version", verbose_name=_("Version"), link=_version_url)
    digest = tables.Column("digest", verbose_name=_("Digest"))
    entries = tables.Column("entries", verbose_name=_("Entries"))
    signed = tables.Column("signed", verbose_name=_("Signed"))
    created_at = tables.Column("created_at", verbose_name=_("Stored"))

    def get_object_id(self, datum: api.PolicyVersion) -> str:
        return str(datum.version)

    class Meta:
        name = "versions"
        verbose_name = _("Versions")
