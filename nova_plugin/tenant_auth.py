"""How the tenant tools reach the verifier and the registrar: on the
user's keystoneauth session (what a cloud runs: no tenant certificate),
or, in the ``noauth`` demo, with the certificate that names the tenant's
project.

On a Keystone session the verifier is the catalog's ``attestation``
service (or ``--verifier``, as an endpoint override) and the registrar's
read side (``[registrar] auth_strategy = keystone``) is ``--registrar``
called with the same token. The nodes' agents are reached only through
the verifier's relay (:mod:`nova_plugin.relay`).
"""

from __future__ import annotations

from typing import Any

from keystoneauth1 import session as ks_session

from nova_plugin.attestation import AttestationClient
from nova_plugin.tenant import Tenant, TenantConfig

__all__ = ["KEYSTONE_LABEL", "keystone_tenant"]

#: ``TenantConfig.verifier_url`` when the verifier is the catalog's.
KEYSTONE_LABEL = "keystone:attestation"


def keystone_tenant(
    session: Any,
    registrar_url: str,
    verifier_url: str | None,
    ca_file: str | None,
    interface: str | None = "public",
    region_name: str | None = None,
) -> Tenant:
    """A tenant whose registrar and verifier calls go over ``session``.

    Args:
        session: the user's keystoneauth session.
        registrar_url: the registrar's base URL.
        verifier_url: the verifier's base URL (None: the catalog's).
        ca_file: the CA bundle the registrar's certificate (and an
            overridden verifier's) chains to (None: the session's).
        interface, region_name: the catalog entry of the verifier.
    """
    registrar_session = session
    if ca_file:  # the operator CA: the same auth plugin, its own trust
        registrar_session = ks_session.Session(auth=session.auth, verify=ca_file)
    verifier = AttestationClient(
        registrar_session if verifier_url else session,
        interface,
        region_name,
        endpoint_override=verifier_url or None,
    )
    registrar = AttestationClient(
        registrar_session, interface, region_name, endpoint_override=registrar_url
    )
    config = TenantConfig(
        registrar_url, verifier_url or KEYSTONE_LABEL, None, None, ca_file
    )
    return Tenant(config, verifier, registrar)
