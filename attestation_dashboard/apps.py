"""The Django application: registers the API's policy rules with Horizon
(``POLICY_FILES["attestation"]``) unless the settings name a file already,
so that an action the API would refuse is not shown."""

from __future__ import annotations

import os

from django.apps import AppConfig
from django.conf import settings

from attestation_dashboard import DEFAULT_POLICY_FILE, POLICY_FILE

#: The service name of the rules in Horizon's policy settings.
POLICY_SERVICE = "attestation"


def register_policy_file() -> str:
    """Point Horizon's ``POLICY_FILES["attestation"]`` at the rules: a
    copy in Horizon's ``POLICY_FILES_PATH`` (where DevStack puts it, and an
    operator edits it) if there is one, else the packaged file. Returns the
    setting's value."""
    files = settings.POLICY_FILES
    if POLICY_SERVICE not in files:
        name = os.path.basename(POLICY_FILE)
        folder = getattr(settings, "POLICY_FILES_PATH", "")
        copied = os.path.join(folder, name)
        files[POLICY_SERVICE] = name if os.path.isfile(copied) else POLICY_FILE
    defaults = getattr(settings, "DEFAULT_POLICY_FILES", None)
    if isinstance(defaults, dict):
        defaults.setdefault(POLICY_SERVICE, DEFAULT_POLICY_FILE)
    return str(files[POLICY_SERVICE])


class AttestationDashboardConfig(AppConfig):
    name = "attestation_dashboard"
    verbose_name = "Attestation"

    def ready(self) -> None:
        register_policy_file()
