"""The attestation dashboard: Horizon panels over the attestation API.

A Horizon plugin in OpenStack's layout (``enabled/_NNNN_*.py``, panels with
their tables, tabs, forms and templates): the project's nodes, a node's
events and history, policies; the operator's fleet, hosts and
revocations. It calls the API with the user's token only
(:mod:`attestation_dashboard.api.attestation`) and imports nothing of the
other packages of this repository.
"""

from __future__ import annotations

import os

__all__ = ["DEFAULT_POLICY_FILE", "POLICY_FILE", "enabled_files"]

_HERE = os.path.dirname(os.path.abspath(__file__))
#: The oslo.policy rules of the API, for Horizon's ``POLICY_FILES``.
POLICY_FILE = os.path.join(_HERE, "conf", "attestation_policy.yaml")
#: The same rules as Horizon's ``DEFAULT_POLICY_FILES`` want them.
DEFAULT_POLICY_FILE = os.path.join(
    _HERE, "conf", "default_policies", "attestation.yaml"
)


def enabled_files() -> list[str]:
    """The paths of the enabled files, in Horizon's order (copy them into
    ``openstack_dashboard/local/enabled``)."""
    folder = os.path.join(_HERE, "enabled")
    return sorted(
        os.path.join(folder, name)
        for name in os.listdir(folder)
        if name.startswith("_") and name.endswith(".py") and name != "__init__.py"
    )
