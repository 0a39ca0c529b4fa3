"""The registrar's host gate: a vTPM EK certificate counts only while the
compute host whose swtpm local CA signed it is attested and proved that CA
(trusted compute pools, issue 29; ARCHITECTURE "Parties and trust").

The verifier attests each compute host under an operator-owned IMA policy
that pins the path of the host's swtpm local CA certificate file
(``issuercert.pem``): when the host's IMA list shows that path, the digest
it measured is the host's *proven CA digest* (sha256 of the file bytes).
The verifier tells the registrar each host's trust (:class:`HostTrust`);
:func:`check_trusted_host_ek` then accepts an EK certificate chained to a
host's enrolled CA only while that host is trusted and its enrolled CA is
the file the host proved.

The enrolled CA is the PEM ``trusted-vtpm-manager enrol-host`` sent: the
issuer certificate file, then (when ``swtpm_localca`` made one) its root.
The proven digest names one file, so :func:`proven_host_anchors` accepts
it when it is the digest of the whole enrolled PEM (a CA enrolled from
one file, ``--ca-file``) or of its leading issuer-certificate part (the
``issuercert.pem`` file, byte for byte); only the certificates of the
proven part are then anchors.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import hashlib
import hmac
from collections.abc import Mapping, Sequence

from cryptography import x509

from verifier.protocol.ekcert import check_host_bound_ek, load_host_ca
from verifier.protocol.errors import EvidenceError, MalformedError
from verifier.protocol.tpm import TpmPublic

__all__ = [
    "HostTrust",
    "HostTrustMode",
    "check_trusted_host_ek",
    "issuer_file_part",
    "proven_host_anchors",
]

_END = b"-----END CERTIFICATE-----"


class HostTrustMode(enum.Enum):
    """``[registrar] host_trust``: whether the gate applies."""

    #: A vTPM EK certificate counts only while its host is attested and
    #: proved its CA (fail closed: no trust record is untrusted).
    REQUIRED = "required"
    #: The behaviour before trusted compute pools: an enrolled host CA is
    #: trusted for as long as it stays enrolled.
    OFF = "off"


@dataclasses.dataclass(frozen=True)
class HostTrust:
    """The verifier's last word on one compute host, as the registrar keeps
    it (:class:`verifier.protocol.messages.host_trust.HostTrustUpdate`).

    Attributes:
        trusted: the host is attested.
        ca_sha256: the proven CA digest (lower-case hex), None if the host's
            IMA list never showed its CA file.
        provider: the host's compute node resource provider UUID.
        as_of: when the verifier judged it (seconds since the epoch).
    """

    trusted: bool
    ca_sha256: str | None
    provider: str
    as_of: float


def issuer_file_part(ca_pem: bytes) -> bytes | None:
    """The leading part of an enrolled CA PEM up to and including the end
    of its first certificate and that line's newline (the issuer
    certificate file as ``read_host_ca`` copied it); None without one."""
    end = ca_pem.find(_END)
    if end < 0:
        return None
    stop = end + len(_END)
    if ca_pem[stop : stop + 2] == b"\r\n":
        return ca_pem[: stop + 2]
    if ca_pem[stop : stop + 1] == b"\n":
        return ca_pem[: stop + 1]
    return ca_pem[:stop]


def _same_digest(data: bytes, hex_digest: str) -> bool:
    return hmac.compare_digest(hashlib.sha256(data).hexdigest(), hex_digest.lower())


def proven_host_anchors(
    host: str, ca_pem: bytes, trust: HostTrust | None
) -> list[x509.Certificate]:
    """The certificates of ``host``'s enrolled CA that the host proved.

    Args:
        host: the compute host's name (for the errors).
        ca_pem: its enrolled CA, as stored.
        trust: the verifier's last word on it (None: never told).

    Returns:
        Every certificate of ``ca_pem`` when the proven digest is that of
        the whole PEM; those of its issuer file part when it is that one's.

    Raises:
        EvidenceError: ``host_untrusted`` (no trust record, or the host is
            not attested) or ``host_ca_unproven`` (the host proved no CA
            file, or another one than the enrolled CA: a swapped CA).
    """
    if trust is None:
        raise EvidenceError(
            "host_untrusted",
            f"compute host {host!r} has no trust record: the verifier has not "
            "attested it (or never told the registrar)",
        )
    if not trust.trusted:
        raise EvidenceError("host_untrusted", f"compute host {host!r} is not attested")
    if trust.ca_sha256 is None:
        raise EvidenceError(
            "host_ca_unproven",
            f"compute host {host!r} is attested but its IMA list shows no vTPM CA file",
        )
    part = issuer_file_part(ca_pem)
    for candidate in (ca_pem, part):
        if candidate is not None and _same_digest(candidate, trust.ca_sha256):
            try:
                return load_host_ca(candidate)
            except MalformedError:
                break
    raise EvidenceError(
        "host_ca_unproven",
        f"the vTPM CA enrolled for compute host {host!r} is not the CA file "
        f"the host proved (sha256 {trust.ca_sha256})",
    )


def check_trusted_host_ek(
    cert_der: bytes | None,
    ek: TpmPublic,
    claimed_uuid: str,
    placed_host: str | None,
    host_anchors: Mapping[str, Sequence[x509.Certificate]],
    now: datetime.datetime,
    *,
    mode: HostTrustMode,
    host_cas: Mapping[str, bytes],
    host_trust: Mapping[str, HostTrust],
) -> x509.Certificate:
    """:func:`~verifier.protocol.ekcert.check_host_bound_ek` behind the
    host gate.

    Args:
        cert_der, ek, claimed_uuid, placed_host, host_anchors, now: as
            :func:`~verifier.protocol.ekcert.check_host_bound_ek`.
        mode: :attr:`HostTrustMode.OFF` skips the gate.
        host_cas: each enrolled host's CA PEM as stored, by host.
        host_trust: each host's trust record the registrar holds, by host.

    Returns:
        The parsed certificate.

    Raises:
        EvidenceError: the reasons of ``check_host_bound_ek``, and
            ``host_untrusted`` or ``host_ca_unproven`` from
            :func:`proven_host_anchors` for the placed host (checked once
            the certificate is present and the placement and CA known).
    """
    if mode is HostTrustMode.OFF or cert_der is None or placed_host is None:
        return check_host_bound_ek(
            cert_der, ek, claimed_uuid, placed_host, host_anchors, now
        )
    ca_pem = host_cas.get(placed_host)
    if ca_pem is None or not host_anchors.get(placed_host):
        return check_host_bound_ek(
            cert_der, ek, claimed_uuid, placed_host, host_anchors, now
        )
    gated = dict(host_anchors)
    gated[placed_host] = proven_host_anchors(
        placed_host, ca_pem, host_trust.get(placed_host)
    )
    return check_host_bound_ek(cert_der, ek, claimed_uuid, placed_host, gated, now)
