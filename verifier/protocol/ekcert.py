"""EK certificate checks (TCG EK Credential Profile for TPM 2.0, 2.2).

An EK certificate is accepted when it parses, it was issued directly by one
of the configured trust anchors (the TPM vendors' or swtpm's local CA,
including any intermediate the operator chose to trust), it is valid at
the time given, and its public key is exactly the EK the node presented.

For a vTPM that Nova's libvirt driver made, :func:`check_host_bound_ek`
binds the EK to one instance on one compute host: libvirt runs
``swtpm_setup --vmid <domain>:<uuid>`` and the host's swtpm local CA signs
an EK certificate whose subject CN is that string. The certificate must be
issued by the CA enrolled for the host Nova placed the instance on (not
any host's CA) and its CN must name the instance UUID the agent claims.
"""

from __future__ import annotations

import datetime
import uuid as uuid_mod
from collections.abc import Mapping, Sequence

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from verifier.protocol.errors import EvidenceError, MalformedError
from verifier.protocol.tpm import TpmPublic

__all__ = [
    "check_ek_certificate",
    "check_host_bound_ek",
    "issuing_hosts",
    "load_anchors",
    "load_host_ca",
    "named_instance",
]


def load_anchors(pem_bundle: bytes) -> list[x509.Certificate]:
    """Parse a PEM bundle of trust anchors.

    Raises:
        MalformedError: if the bundle holds no certificate.
    """
    try:
        certs = x509.load_pem_x509_certificates(pem_bundle)
    except ValueError as exc:
        raise MalformedError("EK CA bundle", str(exc))
    if not certs:
        raise MalformedError("EK CA bundle", "no certificate in bundle")
    return certs


#: Largest host CA PEM accepted (a root and a few intermediates).
MAX_HOST_CA_PEM = 32 * 1024
_MAX_HOST_CA_CERTS = 8


def load_host_ca(pem: bytes) -> list[x509.Certificate]:
    """Parse a compute host's swtpm local CA (PEM, root and/or intermediates).

    Raises:
        MalformedError: too large, not PEM certificates, too many, or a
            certificate that is not a CA (basicConstraints cA true).
    """
    if len(pem) > MAX_HOST_CA_PEM:
        raise MalformedError("host CA", f"more than {MAX_HOST_CA_PEM} bytes")
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise MalformedError("host CA", f"not PEM certificates: {exc}")
    if not certs or len(certs) > _MAX_HOST_CA_CERTS:
        raise MalformedError(
            "host CA", f"needs 1 to {_MAX_HOST_CA_CERTS} certificates, has {len(certs)}"
        )
    for cert in certs:
        try:
            constraints = cert.extensions.get_extension_for_class(
                x509.BasicConstraints
            ).value
        except (x509.ExtensionNotFound, ValueError):
            constraints = None
        if constraints is None or not constraints.ca:
            raise MalformedError(
                "host CA", f"{cert.subject.rfc4514_string()!r} is not a CA certificate"
            )
    return certs


def issuing_hosts(
    cert_der: bytes, host_anchors: Mapping[str, Sequence[x509.Certificate]]
) -> list[str]:
    """The enrolled hosts whose CA signed ``cert_der`` (sorted; [] if it
    does not parse or none did)."""
    try:
        cert = x509.load_der_x509_certificate(cert_der)
    except ValueError:
        return []
    return sorted(
        host
        for host, anchors in host_anchors.items()
        if any(_issued_by(cert, a) for a in anchors)
    )


def _issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    if cert.issuer != issuer.subject:
        return False
    key = issuer.public_key()
    algorithm = cert.signature_hash_algorithm
    try:
        if isinstance(key, rsa.RSAPublicKey) and algorithm is not None:
            key.verify(
                cert.signature,
                cert.tbs_certificate_bytes,
                padding.PKCS1v15(),
                algorithm,
            )
        elif isinstance(key, ec.EllipticCurvePublicKey) and algorithm is not None:
            key.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(algorithm))
        else:
            return False
    except InvalidSignature:
        return False
    return True


def check_ek_certificate(
    cert_der: bytes,
    ek: TpmPublic,
    anchors: Sequence[x509.Certificate],
    now: datetime.datetime,
) -> x509.Certificate:
    """Verify an EK certificate against trust anchors and the EK.

    Args:
        cert_der: the EK certificate (DER) read from the TPM's NV.
        ek: the EK the node presented.
        anchors: trusted CA certificates.
        now: the current time (UTC, timezone-aware).

    Returns:
        The parsed certificate.

    Raises:
        EvidenceError: ``ek_certificate`` naming the failed check.
    """
    try:
        cert = x509.load_der_x509_certificate(cert_der)
    except ValueError as exc:
        raise EvidenceError("ek_certificate", f"EK certificate does not parse: {exc}")
    if not any(_issued_by(cert, anchor) for anchor in anchors):
        raise EvidenceError(
            "ek_certificate", "EK certificate is not issued by a trusted EK CA"
        )
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise EvidenceError("ek_certificate", "EK certificate is not valid now")
    if not ek.same_key(cert.public_key()):
        raise EvidenceError(
            "ek_certificate", "EK certificate is for another key than the EK"
        )
    return cert


def named_instance(cert_der: bytes) -> str | None:
    """The instance UUID an EK certificate names, if it names one.

    libvirt runs ``swtpm_setup --vmid <domain>:<uuid>`` and swtpm's local
    CA writes that string as the certificate's subject common name; a TPM
    vendor's EK certificate names no instance.

    Returns:
        The UUID after the last ``:`` of the subject CN (canonical form), or
        None if the CN has no such part or the certificate does not parse.
    """
    try:
        cert = x509.load_der_x509_certificate(cert_der)
        names = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    except ValueError:
        return None
    for name in names:
        value = name.value if isinstance(name.value, str) else ""
        head, sep, tail = value.rpartition(":")
        if not sep:
            continue
        try:
            return str(uuid_mod.UUID(tail))
        except ValueError:
            continue
    return None


def check_host_bound_ek(
    cert_der: bytes | None,
    ek: TpmPublic,
    claimed_uuid: str,
    placed_host: str | None,
    host_anchors: Mapping[str, Sequence[x509.Certificate]],
    now: datetime.datetime,
) -> x509.Certificate:
    """Verify that an EK is the vTPM Nova made for ``claimed_uuid``.

    Args:
        cert_der: the EK certificate the agent presented (None: none).
        ek: the EK the agent presented.
        claimed_uuid: the instance UUID the agent registers as.
        placed_host: the compute host Nova placed that instance on (from
            its notifications), None if unknown.
        host_anchors: each enrolled compute host's swtpm local CA
            certificates (root and/or intermediate), by host name.
        now: the current time (UTC, timezone-aware).

    Returns:
        The parsed certificate.

    Raises:
        EvidenceError: with the reason of the first failed check:
            ``ek_certificate_missing`` (no certificate),
            ``instance_host_unknown`` (Nova's placement is not known),
            ``host_ca_unknown`` (no CA enrolled for that host),
            ``ek_certificate`` (does not parse, not valid now, or for
            another key than the EK), ``ek_certificate_other_host`` (not
            issued by the placed host's CA; the detail names the enrolled
            host whose CA did issue it, if any),
            ``ek_certificate_no_instance`` (its CN names no instance) or
            ``ek_certificate_other_instance`` (its CN names another one).
    """
    if cert_der is None:
        raise EvidenceError(
            "ek_certificate_missing",
            "a vTPM's EK certificate (signed by its compute host's CA) is required",
        )
    if placed_host is None:
        raise EvidenceError(
            "instance_host_unknown",
            f"no compute host is known for instance {claimed_uuid}",
        )
    anchors = _placed_host_ca(placed_host, host_anchors)
    cert = _load_from_placed_host(
        cert_der, claimed_uuid, placed_host, anchors, host_anchors
    )
    check_ek_certificate(cert_der, ek, anchors, now)
    _check_names_instance(cert_der, claimed_uuid)
    return cert


def _placed_host_ca(
    placed_host: str, host_anchors: Mapping[str, Sequence[x509.Certificate]]
) -> list[x509.Certificate]:
    """The CA certificates enrolled for ``placed_host``.

    Raises:
        EvidenceError: ``host_ca_unknown``, that host has none.
    """
    anchors = list(host_anchors.get(placed_host, ()))
    if not anchors:
        raise EvidenceError(
            "host_ca_unknown",
            f"compute host {placed_host!r} has no enrolled vTPM CA",
        )
    return anchors


def _load_from_placed_host(
    cert_der: bytes,
    claimed_uuid: str,
    placed_host: str,
    anchors: Sequence[x509.Certificate],
    host_anchors: Mapping[str, Sequence[x509.Certificate]],
) -> x509.Certificate:
    """Parse the EK certificate and check that the CA of the host the
    instance was placed on (``anchors``) issued it.

    Raises:
        EvidenceError: ``ek_certificate`` (does not parse) or
            ``ek_certificate_other_host`` (that CA did not issue it; the
            detail names the first, by name, of the other enrolled hosts
            whose CA did, if any).
    """
    try:
        cert = x509.load_der_x509_certificate(cert_der)
    except ValueError as exc:
        raise EvidenceError("ek_certificate", f"EK certificate does not parse: {exc}")
    if not any(_issued_by(cert, anchor) for anchor in anchors):
        issuers = sorted(
            host
            for host, others in host_anchors.items()
            if host != placed_host and any(_issued_by(cert, a) for a in others)
        )
        where = f" (it was issued by the CA of {issuers[0]!r})" if issuers else ""
        raise EvidenceError(
            "ek_certificate_other_host",
            f"EK certificate is not issued by the vTPM CA of {placed_host!r}, "
            f"the host running instance {claimed_uuid}{where}",
        )
    return cert


def _check_names_instance(cert_der: bytes, claimed_uuid: str) -> None:
    """Check that the EK certificate's CN names the instance ``claimed_uuid``.

    Raises:
        EvidenceError: ``ek_certificate_no_instance`` (it names none) or
            ``ek_certificate_other_instance`` (it names another one, or
            ``claimed_uuid`` is not a UUID).
    """
    named = named_instance(cert_der)
    if named is None:
        raise EvidenceError(
            "ek_certificate_no_instance", "EK certificate names no instance"
        )
    try:
        claimed = str(uuid_mod.UUID(claimed_uuid))
    except (ValueError, AttributeError, TypeError):
        raise EvidenceError("ek_certificate_other_instance", "not a UUID claimed")
    if named != claimed:
        raise EvidenceError(
            "ek_certificate_other_instance",
            f"EK certificate names instance {named}, not {claimed}",
        )
