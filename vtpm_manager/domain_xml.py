"""The TPM device of a libvirt domain, in Nova's form (pure XML logic).

Nova (``hw:tpm_version=2.0``, ``hw:tpm_model``) writes::

    <tpm model='tpm-crb'>
      <backend type='emulator' version='2.0'>
        <encryption secret='SECRET-UUID'/>
      </backend>
    </tpm>

libvirt cannot hot-attach a TPM, so a missing device is added to the
persistent definition and takes effect at the domain's next cold boot.
"""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET

from vtpm_manager.exceptions import UnsupportedTpmError, VtpmError

__all__ = ["MODELS", "TpmDevice", "DomainInfo", "ensure_tpm", "parse_domain"]

MODELS = ("tpm-crb", "tpm-tis")


@dataclasses.dataclass(frozen=True)
class TpmDevice:
    """A domain's TPM 2.0 emulator device."""

    model: str
    secret: str | None = None


@dataclasses.dataclass(frozen=True)
class DomainInfo:
    """What the manager needs from a domain definition."""

    name: str
    uuid: str
    tpm: TpmDevice | None


def _root(xml: str) -> ET.Element:
    try:
        # The XML comes from libvirt (its API or libvirtd's hook stdin), and
        # the expat parser behind ElementTree expands no external entities.
        root = ET.fromstring(xml)  # noqa: S314
    except ET.ParseError as exc:
        raise VtpmError(f"unparsable domain XML: {exc}")
    if root.tag != "domain":
        raise VtpmError(f"not a libvirt domain XML (root element <{root.tag}>)")
    return root


def _tpm(root: ET.Element, name: str) -> TpmDevice | None:
    devices = root.findall("./devices/tpm")
    if not devices:
        return None
    if len(devices) > 1:
        raise UnsupportedTpmError(f"domain {name!r} has {len(devices)} TPM devices")
    tpm = devices[0]
    backend = tpm.find("backend")
    kind = backend.get("type") if backend is not None else None
    if backend is None or kind != "emulator":
        raise UnsupportedTpmError(
            f"domain {name!r} has a TPM with backend {kind!r}; only the swtpm "
            "'emulator' backend can be a companion vTPM"
        )
    version = backend.get("version", "1.2")  # libvirt's default is 1.2
    if version != "2.0":
        raise UnsupportedTpmError(
            f"domain {name!r} has a TPM {version} device; the vTPM manager "
            "supports TPM 2.0 only (replace it: Nova's hw:tpm_version=2.0)"
        )
    model = tpm.get("model", "tpm-tis")
    if model not in MODELS:
        raise UnsupportedTpmError(f"domain {name!r} has TPM model {model!r}")
    encryption = backend.find("encryption")
    secret = encryption.get("secret") if encryption is not None else None
    return TpmDevice(model, secret)


def parse_domain(xml: str) -> DomainInfo:
    """Read name, UUID and TPM device from a domain's XML.

    Raises:
        UnsupportedTpmError: a TPM 1.2, passthrough or unknown-model device.
        VtpmError: not a domain XML.
    """
    root = _root(xml)
    name = root.findtext("name") or ""
    uuid = (root.findtext("uuid") or "").strip().lower()
    if not name or not uuid:
        raise VtpmError("domain XML without <name> or <uuid>")
    return DomainInfo(name, uuid, _tpm(root, name))


def ensure_tpm(xml: str, model: str, secret: str | None = None) -> tuple[str, bool]:
    """Return the domain XML with a TPM 2.0 emulator device.

    An existing TPM 2.0 emulator device is kept as it is (its model and
    encryption secret win: Nova chose them); a missing one is added.

    Args:
        xml: the persistent domain definition.
        model: ``tpm-crb`` or ``tpm-tis`` for a new device.
        secret: UUID of the libvirt secret encrypting the state, or None.

    Returns:
        (new XML, whether it changed).

    Raises:
        UnsupportedTpmError: the domain has a TPM device of another kind.
        VtpmError: bad model or XML.
    """
    if model not in MODELS:
        raise VtpmError(f"TPM model must be one of {', '.join(MODELS)}, not {model!r}")
    root = _root(xml)
    info = parse_domain(xml)
    if info.tpm is not None:
        return xml, False
    devices = root.find("devices")
    if devices is None:
        devices = ET.SubElement(root, "devices")
    tpm = ET.SubElement(devices, "tpm", {"model": model})
    backend = ET.SubElement(tpm, "backend", {"type": "emulator", "version": "2.0"})
    if secret:
        ET.SubElement(backend, "encryption", {"secret": secret})
    return ET.tostring(root, encoding="unicode"), True
