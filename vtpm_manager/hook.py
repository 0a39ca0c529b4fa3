"""The libvirt qemu hook (``/etc/libvirt/hooks/qemu``).

libvirtd runs the hook as ``qemu <domain> <operation> <sub-operation> -``
with the domain XML on stdin, synchronously: a non-zero exit at
``prepare begin`` aborts the start. A hook must not call back into libvirt
(it would deadlock), so it works from the XML alone:

* ``prepare begin`` of a domain with a TPM 2.0 emulator device: make the
  swtpm state if there is none (the domain's first start), read its EK and
  register it under the instance UUID (= the domain UUID, as Nova sets it).
  A domain with an encrypted vTPM must have gone through
  ``trusted-vtpm-manager ensure`` (which can read the secret from libvirt);
  the hook then only checks that the registrar knows the instance.
* every other operation: nothing (undefine is ``trusted-vtpm-manager
  undefine`` or ``forget``: libvirt has no undefine hook).
"""

from __future__ import annotations

import logging
import os
import shutil

from vtpm_manager import domain_xml, swtpm_state
from vtpm_manager.exceptions import VtpmError
from vtpm_manager.manager import ManagerConfig
from vtpm_manager.registrar_client import ProviderRegistrarClient

__all__ = ["on_prepare"]

LOG = logging.getLogger(__name__)


def on_prepare(
    xml: str, config: ManagerConfig, registrar: ProviderRegistrarClient
) -> str | None:
    """Provision the vTPM of a domain about to start.

    Returns:
        What was done, or None for a domain without a TPM.

    Raises:
        VtpmError: (and its subclasses) the start should be refused.
    """
    info = domain_xml.parse_domain(xml)
    if info.tpm is None:
        return None
    instance = info.uuid
    if info.tpm.secret is not None:
        if registrar.get_ek(instance) is None:
            raise VtpmError(
                f"domain {info.name} has an encrypted vTPM that no provider "
                f"registered: run 'trusted-vtpm-manager ensure {info.name}' "
                "before starting it"
            )
        return f"{info.name}: encrypted vTPM already registered"
    path = swtpm_state.state_dir(config.swtpm_storage_dir, info.uuid)
    with swtpm_state.locked(config.swtpm_storage_dir, info.uuid):
        created = swtpm_state.create_state(
            path,
            config.localca_dir,
            f"{info.name}:{info.uuid}",
            None,
            config.swtpm_setup,
        )
        try:
            ek = swtpm_state.read_ek(path, config.ek_alg)
            new = registrar.register_ek(instance, ek)
        except BaseException:
            if created:
                shutil.rmtree(os.path.dirname(path), ignore_errors=True)
            raise
    return (
        f"{info.name}: vTPM state {'created' if created else 'present'} in "
        f"{path}, EK {'registered' if new else 'already registered'} "
        f"under {instance}"
    )
