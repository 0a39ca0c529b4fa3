PANEL = "attestation_nodes"
PANEL_DASHBOARD = "project"
PANEL_GROUP = "attestation"
ADD_PANEL = "attestation_dashboard.content.nodes.panel.Nodes"
ADD_INSTALLED_APPS = ["attestation_dashboard"]
AUTO_DISCOVER_STATIC_FILES = True
