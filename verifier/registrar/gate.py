"""Whether a registration is bound to a compute host, and its check
(:func:`~verifier.protocol.hosttrust.check_trusted_host_ek`) — at
registration and again at activation, so that a challenge a host earned
while trusted cannot be answered after it lost its trust.
"""

from __future__ import annotations

import datetime

from verifier.exceptions import RequestError
from verifier.protocol import EvidenceError, TpmPublic
from verifier.protocol.ekcert import issuing_hosts
from verifier.protocol.hosttrust import HostTrustMode, check_trusted_host_ek
from verifier.registrar.hosts import HostBinding

__all__ = ["check_host_gate"]


def _bound(ek_certificate: bytes | None, binding: HostBinding | None) -> bool:
    if binding is None:
        return False  # no host CA enrolled: EK anchors as before
    if binding.placed_host is not None:
        return True
    cert = ek_certificate
    return cert is not None and bool(issuing_hosts(cert, binding.anchors))


def check_host_gate(
    uuid: str,
    ek_public: bytes,
    ek_certificate: bytes | None,
    binding: HostBinding | None,
    mode: HostTrustMode,
) -> bool:
    """Check a registration bound to a compute host (its placement is known,
    or an enrolled host CA signed its EK certificate).

    Returns:
        True if it is host-bound (and passed), False if it is not (the
        registrar's EK anchors apply).

    Raises:
        RequestError: (403) the check's named reason (``host_untrusted``,
            ``host_ca_unproven``, ``ek_certificate_other_host``, ...).
        MalformedError: ``ek_public`` is no TPM2B_PUBLIC.
    """
    if not _bound(ek_certificate, binding):
        return False
    assert binding is not None
    now = datetime.datetime.now(datetime.UTC)
    try:
        check_trusted_host_ek(
            ek_certificate,
            TpmPublic.from_bytes(ek_public),
            uuid,
            binding.placed_host,
            binding.anchors,
            now,
            mode=mode,
            host_cas=binding.ca_pems,
            host_trust=binding.trust,
        )
    except EvidenceError as exc:
        raise RequestError(exc.reason, exc.detail, 403)
    return True
