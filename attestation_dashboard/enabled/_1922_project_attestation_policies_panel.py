PANEL = "attestation_policies"
PANEL_DASHBOARD = "project"
PANEL_GROUP = "attestation"
ADD_PANEL = "attestation_dashboard.content.policies.panel.Policies"
