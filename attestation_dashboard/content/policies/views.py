"""The project's policies, a policy's versions and content with the dry
run of a runtime version against the project's nodes, the upload form."""

from __future__ import annotations

import json
from typing import Any

from django import http
from django.urls import reverse, reverse_lazy
from django.utils.translation import gettext_lazy as _
from horizon import forms, tables
from openstack_dashboard import policy

from attestation_dashboard.api import attestation as api
from attestation_dashboard.content import common
from attestation_dashboard.content.nodes.tables import policy_rule
from attestation_dashboard.content.policies import forms as policy_forms
from attestation_dashboard.content.policies import tables as policy_tables

__all__ = ["DetailView", "IndexView", "UploadView"]

#: The most characters of a document the page shows.
MAX_SHOWN = 200_000


class IndexView(tables.DataTableView):
    table_class = policy_tables.PoliciesTable
    template_name = "attestation_dashboard/policies/index.html"
    page_title = _("Attestation Policies")

    def get_data(self) -> list[policy_tables.PolicyRow]:
        versions = common.fetch(self.request, api.policy_list, default=[])
        return policy_tables.rows_of(versions)


class UploadView(forms.ModalFormView):
    form_class = policy_forms.UploadPolicyForm
    template_name = "attestation_dashboard/policies/upload.html"
    modal_id = "upload_policy_modal"
    modal_header = _("Upload Policy")
    submit_label = _("Upload")
    page_title = _("Upload Policy")
    submit_url = reverse_lazy("horizon:project:attestation_policies:upload")
    success_url = reverse_lazy("horizon:project:attestation_policies:index")


def _pretty(document: Any) -> str:
    text = json.dumps(document, indent=2, sort_keys=True)
    if len(text) > MAX_SHOWN:
        return text[:MAX_SHOWN] + "\n… (" + str(len(text) - MAX_SHOWN) + " more)"
    return text


class DetailView(tables.DataTableView):
    """A name's versions, one version's document (``?version=N``, the
    latest by default) and, for a runtime policy, its dry run."""

    table_class = policy_tables.VersionsTable
    template_name = "attestation_dashboard/policies/detail.html"
    page_title = _("Policy {{ kind }}:{{ name }}")

    def _kind(self) -> str:
        kind: str = self.kwargs["kind"]
        if kind not in api.POLICY_KINDS:
            raise http.Http404("no such policy kind")
        return kind

    def get_data(self) -> list[api.PolicyVersion]:
        kind, name = self._kind(), self.kwargs["name"]
        versions = common.fetch(self.request, api.policy_list, [kind], default=[])
        return sorted(
            (v for v in versions if v.name == name), key=lambda v: v.version or 0
        )

    def _ref(self) -> str:
        version = self.request.GET.get("version") or self.request.POST.get("version")
        name: str = self.kwargs["name"]
        return f"{name}@{version}" if version and version.isdigit() else name

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        kind = self._kind()
        shown = common.fetch(
            self.request, api.policy_get, kind, self._ref(), default=None
        )
        context.update(
            kind=kind,
            name=self.kwargs["name"],
            shown=shown,
            document=None if shown is None else _pretty(shown.document),
            can_check=kind == "runtime" and shown is not None and self._may_check(),
            check=getattr(self, "_check", None),
            url=reverse(
                "horizon:project:attestation_policies:detail",
                args=[kind, self.kwargs["name"]],
            ),
        )
        return context

    def _may_check(self) -> bool:
        return bool(policy.check(policy_rule("policy:check"), self.request))

    def post(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        if request.POST.get("dry_run") != "1":
            return super().post(request, *args, **kwargs)
        if self._kind() != "runtime" or not self._may_check():
            raise http.Http404("no dry run here")
        self._check = common.fetch(request, api.check_policy, self._ref(), default=None)
        return self.get(request, *args, **kwargs)
