PANEL = "attestation"
PANEL_DASHBOARD = "admin"
PANEL_GROUP = "admin"
ADD_PANEL = "attestation_dashboard.content.admin.panel.Attestation"
