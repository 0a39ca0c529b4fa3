"""Change the policies in force on a node (``PUT /v1/nodes/{uuid}/policy``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django import forms as django_forms
from django.utils.translation import gettext_lazy as _
from horizon import forms, messages

from attestation_dashboard.api import attestation as api
from attestation_dashboard.content import common
from attestation_dashboard.exceptions import (
    AttestationRefusedError,
    AttestationUnreachableError,
)

__all__ = ["KEEP", "NONE", "ChangePolicyForm", "policy_choices"]

#: The choice that leaves a kind of policy as it is.
KEEP = ""
#: The choice that drops a kind of policy.
NONE = "-"
#: Form field -> policy kind (the API's field names).
FIELDS = {"runtime_policy": "runtime", "mb_policy": "measured-boot"}


def policy_choices(
    versions: Sequence[api.PolicyVersion], kind: str
) -> list[tuple[str, str]]:
    """The choices of one kind: unchanged, none, then per name its latest
    (``name``: the node follows the name to each new version) and each
    version (``name@v``, shown ``name:v``: pinned)."""
    choices = [(KEEP, _("(unchanged)")), (NONE, _("(no policy of this kind)"))]
    names: dict[str, list[int]] = {}
    for v in versions:
        if v.kind == kind and v.version is not None:
            names.setdefault(v.name, []).append(v.version)
    for name in sorted(names):
        choices.append((name, _("%s (follow the latest version)") % name))
        for version in sorted(names[name], reverse=True):
            choices.append((f"{name}@{version}", f"{name}:{version}"))
    return choices


class ChangePolicyForm(forms.SelfHandlingForm):
    node_id = forms.CharField(widget=forms.HiddenInput())
    runtime_policy = forms.ChoiceField(
        label=_("Runtime (IMA) policy"), required=False, choices=()
    )
    mb_policy = forms.ChoiceField(
        label=_("Measured-boot policy"), required=False, choices=()
    )

    def __init__(self, request: Any, *args: Any, **kwargs: Any) -> None:
        versions = kwargs.pop("versions", ())
        super().__init__(request, *args, **kwargs)
        for field, kind in FIELDS.items():
            self.fields[field].choices = policy_choices(versions, kind)

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean() or {}
        if all(data.get(f, KEEP) == KEEP for f in FIELDS):
            raise django_forms.ValidationError(
                _("Choose a runtime or measured-boot policy to change.")
            )
        return data

    def handle(self, request: Any, data: dict[str, Any]) -> bool:
        changes: dict[str, str | None] = {}
        for field in FIELDS:
            value = data.get(field, KEEP)
            if value != KEEP:
                changes[field] = None if value == NONE else value
        try:
            api.set_node_policy(request, data["node_id"], changes)
        except AttestationUnreachableError as exc:
            self.api_error(common.UNREACHABLE.format(reason=exc.reason))
            return False
        except AttestationRefusedError as exc:
            self.api_error(exc.message)
            return False
        messages.success(
            request, _("The policies of node %s changed.") % data["node_id"]
        )
        return True
