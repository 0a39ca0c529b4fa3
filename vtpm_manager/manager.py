"""Companion vTPMs for libvirt domains, registered under instance UUIDs.

``ensure`` is the provisioning step of the trusted-cloud flow: the domain
gets a TPM 2.0 emulator device in Nova's form, its swtpm state (EK + EK
certificate) is manufactured before the first start, and the EK goes to the
registrar as a *provider* registration under the instance UUID, so the
guest agent's later AK registration must come from that vTPM.

Order matters for "no half state": everything that can fail (the XML check,
swtpm_setup, reading the EK, the registrar) happens before the domain is
redefined, and a state this call created is removed again if a later step
fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import uuid as uuid_mod

import libvirt

from verifier.protocol import MalformedError, canonical_uuid
from vtpm_manager import domain_xml, swtpm_state
from vtpm_manager.exceptions import (
    DomainNotFoundError,
    LibvirtError,
    VtpmError,
)
from vtpm_manager.registrar_client import ProviderRegistrarClient

__all__ = ["EnsureResult", "ManagerConfig", "VtpmManager"]

LOG = logging.getLogger(__name__)


def _canonical(value: str) -> str:
    """``value`` in the form :func:`verifier.protocol.canonical_uuid` gives.

    Raises:
        VtpmError: not a UUID (the message the command line shows).
    """
    try:
        return canonical_uuid(value)
    except MalformedError:
        raise VtpmError(f"not a UUID: {value!r}")


@dataclasses.dataclass(frozen=True)
class ManagerConfig:
    """Where states live and how they are made.

    Attributes:
        swtpm_storage_dir: libvirt's swtpm storage directory.
        localca_dir: the local CA signing vTPM EK certificates.
        ek_alg: the EK the guest agent uses (``rsa`` or ``ecc``).
        default_model: TPM model of a newly added device.
        keep_state: keep the state when a domain is undefined.
        swtpm_setup: the swtpm_setup executable.
        host: this compute host's Nova name (its CA's name at the
            registrar; "" when unknown).
    """

    swtpm_storage_dir: str = "/var/lib/libvirt/swtpm"
    localca_dir: str = "/var/lib/trusted-cloud/vtpm-localca"
    ek_alg: str = "rsa"
    default_model: str = "tpm-crb"
    keep_state: bool = False
    swtpm_setup: str = "swtpm_setup"
    host: str = ""


@dataclasses.dataclass(frozen=True)
class EnsureResult:
    """What ``ensure`` did.

    Attributes:
        pending_cold_boot: the device was added to a running domain's
            definition; the guest sees it only after its next cold boot
            (shut down and start; a reboot keeps the old machine).
    """

    domain: str
    domain_uuid: str
    instance_uuid: str
    model: str
    state_dir: str
    device_added: bool
    state_created: bool
    newly_registered: bool
    pending_cold_boot: bool

    def summary(self) -> str:
        parts = [
            f"domain {self.domain} (instance {self.instance_uuid}):",
            f"TPM 2.0 {self.model}",
            "added to the definition" if self.device_added else "already defined",
            f"state {'created' if self.state_created else 'present'} "
            f"in {self.state_dir},",
            "EK registered" if self.newly_registered else "EK already registered",
        ]
        if self.pending_cold_boot:
            parts.append(
                "; the domain is running: it gets the vTPM at its next cold "
                "boot (shut down, then start)"
            )
        return " ".join(parts)


class VtpmManager:
    """Ensures and removes companion vTPMs on one compute host.

    Args:
        conn: an open libvirt connection (``qemu:///system`` in production).
        registrar: the provider client of the registrar.
        config: state locations and defaults.
        secret_conn: the connection holding libvirt secrets (default
            ``conn``; ``secret:///embed?root=...`` beside an embedded qemu).
    """

    def __init__(
        self,
        conn: libvirt.virConnect,
        registrar: ProviderRegistrarClient,
        config: ManagerConfig,
        secret_conn: libvirt.virConnect | None = None,
    ) -> None:
        self._conn = conn
        self._secret_conn = secret_conn or conn
        self._registrar = registrar
        self._config = config

    def _lookup(self, domain: str) -> libvirt.virDomain:
        try:
            try:
                uuid = str(uuid_mod.UUID(domain))
            except ValueError:
                return self._conn.lookupByName(domain)
            return self._conn.lookupByUUIDString(uuid)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                raise DomainNotFoundError(domain)
            raise LibvirtError(f"lookup of {domain!r}: {exc}")

    def _secret_value(self, secret_uuid: str | None) -> bytes | None:
        if secret_uuid is None:
            return None
        try:
            return bytes(
                self._secret_conn.secretLookupByUUIDString(secret_uuid).value()
            )
        except libvirt.libvirtError as exc:
            raise LibvirtError(
                f"cannot read the vTPM encryption secret {secret_uuid}: {exc} "
                "(the manager needs the passphrase to manufacture the state)"
            )

    def state_dir(self, domain_uuid: str) -> str:
        """libvirt's state directory for a domain's TPM 2.0."""
        return swtpm_state.state_dir(self._config.swtpm_storage_dir, domain_uuid)

    def ensure(
        self,
        domain: str,
        instance_uuid: str | None = None,
        model: str | None = None,
        secret_uuid: str | None = None,
    ) -> EnsureResult:
        """Give ``domain`` a registered TPM 2.0 vTPM (idempotent).

        Args:
            domain: the libvirt domain's name or UUID.
            instance_uuid: the Nova instance UUID (default: the domain UUID,
                which Nova sets to the instance UUID).
            model: ``tpm-crb`` or ``tpm-tis`` for a new device.
            secret_uuid: libvirt secret encrypting a new device's state.

        Raises:
            DomainNotFoundError: unknown domain.
            UnsupportedTpmError: the domain has a TPM 1.2 or passthrough TPM.
            SwtpmSetupError: the state could not be made or read.
            EkConflictError: the instance is registered with another EK.
            RegistrarUnavailableError: the registrar stayed unreachable.
            LibvirtError: libvirt refused to redefine the domain.
        """
        dom = self._lookup(domain)
        try:
            if not dom.isPersistent():
                raise VtpmError(
                    f"domain {domain!r} is transient: a TPM can only be added "
                    "to a persistent definition"
                )
            xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
            running = bool(dom.isActive())
            live = domain_xml.parse_domain(dom.XMLDesc(0)) if running else None
        except libvirt.libvirtError as exc:
            raise LibvirtError(f"reading domain {domain!r}: {exc}")
        new_xml, changed = domain_xml.ensure_tpm(
            xml, model or self._config.default_model, secret_uuid
        )
        info = domain_xml.parse_domain(new_xml)
        assert info.tpm is not None
        instance = _canonical(instance_uuid or info.uuid)
        secret = self._secret_value(info.tpm.secret)
        with swtpm_state.locked(self._config.swtpm_storage_dir, info.uuid):
            return self._provision(
                info, new_xml, changed, instance, secret, running, live
            )

    def _provision(
        self,
        info: domain_xml.DomainInfo,
        new_xml: str,
        changed: bool,
        instance: str,
        secret: bytes | None,
        running: bool,
        live: domain_xml.DomainInfo | None,
    ) -> EnsureResult:
        assert info.tpm is not None
        path = self.state_dir(info.uuid)
        created = swtpm_state.create_state(
            path,
            self._config.localca_dir,
            f"{info.name}:{info.uuid}",
            secret,
            self._config.swtpm_setup,
        )
        registered = False
        try:
            ek = swtpm_state.read_ek(path, self._config.ek_alg, secret)
            registered = self._registrar.register_ek(instance, ek)
            if changed:
                try:
                    self._conn.defineXML(new_xml)
                except libvirt.libvirtError as exc:
                    raise LibvirtError(f"redefining {info.name}: {exc}")
        except BaseException:
            if registered:
                with contextlib.suppress(VtpmError):
                    self._registrar.deregister(instance)
            if created:
                self._remove_state(info.uuid)
            raise
        result = EnsureResult(
            domain=info.name,
            domain_uuid=info.uuid,
            instance_uuid=instance,
            model=info.tpm.model,
            state_dir=path,
            device_added=changed,
            state_created=created,
            newly_registered=registered,
            pending_cold_boot=running and (live is None or live.tpm is None),
        )
        LOG.info("%s", result.summary())
        return result

    def _remove_state(self, domain_uuid: str) -> None:
        top = os.path.dirname(self.state_dir(domain_uuid))
        shutil.rmtree(top, ignore_errors=True)

    def forget(
        self, instance_uuid: str, domain_uuid: str, keep_state: bool | None = None
    ) -> bool:
        """Deregister an instance and delete (or keep) its vTPM state.

        For domains already undefined (e.g. by Nova). Returns whether the
        registrar knew the instance.

        Raises:
            RegistrarUnavailableError: the registrar stayed unreachable (the
                state is then left alone, so the call can be repeated).
        """
        known = self._registrar.deregister(_canonical(instance_uuid))
        keep = self._config.keep_state if keep_state is None else keep_state
        if not keep:
            self._remove_state(_canonical(domain_uuid))
        return known

    def undefine(
        self,
        domain: str,
        instance_uuid: str | None = None,
        keep_state: bool | None = None,
    ) -> bool:
        """Deregister the instance, then undefine the domain.

        The registrar goes first: if it is unreachable the domain stays
        defined and registered, and the call can be repeated.

        Returns:
            Whether the registrar knew the instance.

        Raises:
            DomainNotFoundError, RegistrarUnavailableError, LibvirtError.
        """
        dom = self._lookup(domain)
        try:
            info = domain_xml.parse_domain(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        except libvirt.libvirtError as exc:
            raise LibvirtError(f"reading domain {domain!r}: {exc}")
        keep = self._config.keep_state if keep_state is None else keep_state
        known = self._registrar.deregister(_canonical(instance_uuid or info.uuid))
        flags = libvirt.VIR_DOMAIN_UNDEFINE_NVRAM
        flags |= (
            libvirt.VIR_DOMAIN_UNDEFINE_KEEP_TPM
            if keep
            else libvirt.VIR_DOMAIN_UNDEFINE_TPM
        )
        try:
            try:
                dom.undefineFlags(flags)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() != libvirt.VIR_ERR_INVALID_ARG:
                    raise
                dom.undefine()  # a driver without TPM/NVRAM undefine flags
        except libvirt.libvirtError as exc:
            raise LibvirtError(f"undefining {info.name}: {exc}")
        if not keep:
            self._remove_state(info.uuid)
        LOG.info(
            "domain %s undefined, instance deregistered, vTPM state %s",
            info.name,
            "kept" if keep else "deleted",
        )
        return known
