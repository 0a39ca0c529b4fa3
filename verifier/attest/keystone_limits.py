"""Quota limits from Keystone's unified limits (oslo.limit).

With ``[quota] source = keystone`` a project's limit of each resource
(``nodes``, ``pending_enrolments``, ``policies``, ``policy_bytes``) is
what Keystone holds for the ``attestation`` service's endpoint: the
project's own limit if there is one, else the registered (default) limit.
A resource Keystone has no registered limit for keeps the limit of
``[quota]`` in the configuration. The counting and the refusal stay in
:class:`~verifier.attest.quotas.Quotas` (flat model: usage counted in the
transaction that adds the resource).

oslo.limit reads its options (``[oslo_limit]``: the service user's
credentials, ideally system-scoped with the ``reader`` role, and
``endpoint_id``) from oslo.config's global ``CONF``, so the verifier
loads its configuration files there too. Limits are read from Keystone
at each check (no cache: a changed limit applies at once); the check
runs on a worker thread. If Keystone cannot be asked the addition is
refused (``503 quota_unavailable``): a quota never fails open.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from verifier.common import extras
from verifier.exceptions import ConfigError, RequestError

__all__ = ["KeystoneLimits"]

LOG = logging.getLogger(__name__)


class KeystoneLimits:
    """Reads project limits with oslo.limit (a ``Quotas`` source).

    Args:
        config_files: the verifier's configuration files, loaded into the
            global ``CONF`` oslo.limit reads ``[oslo_limit]`` from.

    Raises:
        ConfigError: oslo.limit cannot reach Keystone or find the
            endpoint (at start: a misconfiguration is found at once).
    """

    def __init__(self, config_files: Collection[str] = ()) -> None:
        from oslo_config import cfg

        extras.require("limits", "[quota] source = keystone")
        from oslo_limit import limit

        if config_files:
            cfg.CONF(
                [], project="trusted-cloud", default_config_files=list(config_files)
            )
        try:
            self._enforcer = limit.Enforcer(_no_usage, cache=False)
            endpoint = self._enforcer.connection.get_endpoint(
                cfg.CONF.oslo_limit.endpoint_id
            )
            self._service_id = endpoint.service_id
            self._region_id = endpoint.region_id
        except Exception as exc:  # oslo.limit, keystoneauth and SDK errors
            raise ConfigError(f"[oslo_limit]: cannot read limits from Keystone: {exc}")

    def __call__(self, project: str, resource: str) -> int | None:
        """``project``'s limit of ``resource``, or None when Keystone has
        no registered limit for it (the configured default applies).

        Raises:
            RequestError: ``quota_unavailable`` (503) if Keystone cannot
                be asked.
        """
        try:
            registered = list(
                self._enforcer.connection.registered_limits(
                    service_id=self._service_id,
                    region_id=self._region_id,
                    resource_name=resource,
                )
            )
            if not registered:
                return None
            ((_, value),) = self._enforcer.get_project_limits(project, [resource])
        except Exception as exc:  # SDK and keystoneauth errors: fail closed
            LOG.warning("Cannot read the %s limit of %s: %s", resource, project, exc)
            raise RequestError(
                "quota_unavailable", "the project's limits cannot be read", 503
            ) from None
        return int(value)


def _no_usage(project: Any, resources: Any) -> dict[str, int]:
    """oslo.limit's usage callback: usage is counted by the store itself."""
    return {}
