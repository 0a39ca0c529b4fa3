"""The libvirt qemu hook (``/etc/libvirt/hooks/qemu``).

libvirtd runs the hook as ``qemu <domain> <operation> <sub-operation> -``
with the domain XML on stdin, synchronously: a non-zero exit at
``prepare begin`` aborts the start. A hook must not call back into libvirt
(it would deadlock), so it works from the XML alone:

* ``prepare begin`` of a domain with an encrypted TPM 2.0 emulator (the
  form Nova's libvirt driver makes): nothing is read or made. libvirt's
  own ``swtpm_setup --vmid <domain>:<uuid>`` makes the state and an EK
  certificate signed by this host's swtpm local CA, which the registrar
  checks against the CA enrolled for the host Nova placed the instance on
  (``trusted-vtpm-manager enrol-host``). The hook only refuses the start
  when this host's CA is not enrolled (and no provider EK was registered
  for the instance by ``trusted-vtpm-manager ensure``, the older path
  that needs the vTPM secret): the guest could never register.
* ``prepare begin`` of a domain with an unencrypted TPM 2.0 emulator (a
  libvirt domain not made by Nova): make the swtpm state if there is none
  (the domain's first start), read its EK and register it under the
  instance UUID (= the domain UUID) as a provider EK.
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
        if config.host and registrar.host_enrolled(config.host):
            return (
                f"{info.name}: encrypted vTPM bound to the CA of {config.host} "
                "(libvirt makes its EK certificate)"
            )
        if registrar.get_ek(instance) is None:
            raise VtpmError(
                f"domain {info.name} has an encrypted vTPM, but the CA of this "
                f"host ({config.host or '[vtpm_manager]/host unset'}) is not "
                "enrolled: run 'trusted-vtpm-manager enrol-host' (or "
                f"'trusted-vtpm-manager ensure {info.name}' where the vTPM "
                "secret is readable) before starting it"
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
