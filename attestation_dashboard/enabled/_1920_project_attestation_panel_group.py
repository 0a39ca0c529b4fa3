from django.utils.translation import gettext_lazy as _

PANEL_GROUP = "attestation"
PANEL_GROUP_NAME = _("Attestation")
PANEL_GROUP_DASHBOARD = "project"
