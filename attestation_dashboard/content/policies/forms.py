"""Upload a policy document as a new version of a name
(``POST /v1/policies/{kind}``)."""

from __future__ import annotations

import json
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

__all__ = ["MAX_UPLOAD", "UploadPolicyForm", "parse_document"]

#: The largest document the form takes (the API's default limit).
MAX_UPLOAD = 64 << 20
_MAX_NAME = 255


def parse_document(raw: bytes) -> Any:
    """The JSON document of an upload.

    Raises:
        django.forms.ValidationError: not UTF-8, or not JSON ("not JSON:
            line L column C: <msg>").
    """
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise django_forms.ValidationError(
            f"not UTF-8 text: byte {exc.start + 1} cannot be decoded"
        )
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise django_forms.ValidationError(
            f"not JSON: line {exc.lineno} column {exc.colno}: {exc.msg}"
        )
    except RecursionError:
        raise django_forms.ValidationError("not JSON: nested too deeply")


class UploadPolicyForm(forms.SelfHandlingForm):
    kind = forms.ThemableChoiceField(
        label=_("Kind"),
        choices=[
            ("runtime", _("Runtime (IMA)")),
            ("measured-boot", _("Measured boot")),
        ],
    )
    name = forms.CharField(
        label=_("Name"),
        max_length=_MAX_NAME,
        help_text=_(
            "A new version of this name if it exists (the nodes that "
            "follow the name switch to it)."
        ),
    )
    policy_file = forms.FileField(
        label=_("Policy file (JSON)"),
        help_text=_(
            "What 'trusted-ima-policy' or 'openstack attestation policy' generate."
        ),
    )

    def clean_policy_file(self) -> Any:
        upload = self.cleaned_data["policy_file"]
        if upload.size > MAX_UPLOAD:
            raise django_forms.ValidationError(
                f"the file is larger than {MAX_UPLOAD >> 20} MiB"
            )
        return parse_document(upload.read())

    def handle(self, request: Any, data: dict[str, Any]) -> Any:
        try:
            stored = api.policy_upload(
                request, data["kind"], data["name"], data["policy_file"]
            )
        except AttestationUnreachableError as exc:
            self.api_error(common.UNREACHABLE.format(reason=exc.reason))
            return False
        except AttestationRefusedError as exc:
            self.api_error(exc.message)
            return False
        messages.success(
            request,
            _("Stored %(kind)s policy %(name)s version %(version)s.")
            % {"kind": stored.kind, "name": stored.name, "version": stored.version},
        )
        return stored
