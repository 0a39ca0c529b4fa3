"""The ``vtpm`` instance hook of ``trusted-nova-listener``.

Nova's notifications say which compute host runs an instance
(``instance.create.end`` and the ends of resize and migration): the hook
records it at the registrar (``PUT /v1/provider/instances/{uuid}``), which
then accepts only a vTPM EK certificate from that host's enrolled swtpm
CA naming that instance (``trusted-vtpm-manager enrol-host``). On
``instance.delete.end`` the placement goes too.

libvirt has no undefine hook, so nothing on the compute host learns that
Nova deleted an instance; the provider's notification listener does
(``instance.delete.end``). This driver of the listener's extension point
(stevedore group ``verifier.instance_hooks``) then removes the instance's
provider EK registration at the registrar (``DELETE /v1/agents/{uuid}/ek``
with a ``provider`` certificate), so a deleted instance's vTPM EK cannot
be used again under its UUID.

The driver implements the public hook interface of the shared plumbing
(:mod:`verifier.common.plugins`) and uses its TLS helpers; the listener
knows the driver only by its entry point name.

Idempotent: an EK that is not (or no longer) registered is success, so a
redelivered event does no harm. An unreachable registrar (after the
retries) raises :class:`InstanceHookRetryError`: the listener requeues the
event. A refusal (e.g. 403, the certificate is not a provider) cannot be
cured by redelivery and raises :class:`InstanceHookError`, which the
listener logs.
"""

from __future__ import annotations

import logging

from oslo_config import cfg

from verifier.common import tls as tlsutil
from verifier.common.plugins import (
    InstanceHook,
    InstanceHookError,
    InstanceHookRetryError,
)
from vtpm_manager.conf import instance_hook as hook_conf
from vtpm_manager.exceptions import RegistrarUnavailableError, RegistrationRefusedError
from vtpm_manager.registrar_client import ProviderRegistrarClient

__all__ = ["VtpmInstanceHook"]

LOG = logging.getLogger(__name__)


class VtpmInstanceHook(InstanceHook):
    """Records where Nova runs an instance; drops a deleted instance's
    placement and provider EK registration.

    Args:
        conf: the listener's configuration; group ``[instance_hook_vtpm]``
            is registered on it.
        client: the registrar client to use (None: built from ``conf``).

    Raises:
        InstanceHookError: the options are incomplete or unreadable.
    """

    def __init__(
        self,
        conf: cfg.ConfigOpts | None = None,
        client: ProviderRegistrarClient | None = None,
    ) -> None:
        super().__init__(conf)
        if client is None:
            client = _client_from(self.conf)
        self._client = client

    def _instance_placed(self, uuid: str, host: str) -> None:
        try:
            new = self._client.place(uuid, host)
        except RegistrarUnavailableError as exc:
            raise InstanceHookRetryError(f"vtpm: {exc}") from exc
        except RegistrationRefusedError as exc:
            raise InstanceHookError(f"vtpm: {exc}") from exc
        LOG.info("Instance %s: %s on %s", uuid, "placed" if new else "now", host)

    def _instance_created(self, uuid: str) -> None:
        """Nothing more: the placement came with the same event."""

    def _instance_deleted(self, uuid: str) -> None:
        try:
            removed = self._client.deregister(uuid)
            self._client.unplace(uuid)
        except RegistrarUnavailableError as exc:
            raise InstanceHookRetryError(f"vtpm: {exc}") from exc
        except RegistrationRefusedError as exc:
            raise InstanceHookError(f"vtpm: {exc}") from exc
        if removed:
            LOG.info("Instance %s: provider vTPM EK deregistered", uuid)
        else:
            LOG.info("Instance %s: no provider vTPM EK registered (any more)", uuid)


def _client_from(conf: cfg.ConfigOpts) -> ProviderRegistrarClient:
    hook_conf.register_opts(conf)
    group = conf[hook_conf.GROUP]
    context = None
    if group.registrar_url.startswith("https://"):
        missing = [n for n in ("cert_file", "key_file", "ca_file") if not group[n]]
        if missing:
            raise InstanceHookError(
                f"missing options in [{hook_conf.GROUP}]: {missing}"
            )
        try:
            context = tlsutil.client_context(
                group.cert_file, group.key_file, group.ca_file
            )
        except (OSError, ValueError) as exc:
            raise InstanceHookError(f"[{hook_conf.GROUP}] TLS files: {exc}") from exc
    try:
        return ProviderRegistrarClient(
            group.registrar_url,
            context,
            retries=group.retries,
            backoff=group.backoff,
            timeout=group.timeout,
        )
    except ValueError as exc:
        raise InstanceHookError(f"[{hook_conf.GROUP}] {exc}") from exc
