"""Horizon's enabled files of the attestation panels (copy them into
``openstack_dashboard/local/enabled``; :func:`attestation_dashboard.enabled_files`
lists them)."""
