"""Monitor attestation requests (Excalibur's "monitor attestation"): a
customer checks the verifier host's integrity. The batched quote that
answers is :class:`verifier.protocol.monitor.MonitorAttestation`; the
activation of the host's AK reuses
:class:`~verifier.protocol.messages.registration.ActivationChallenge` and
:class:`~verifier.protocol.messages.registration.ActivationProof`.

``GET /v1/monitor/attest?nonce=HEX``, ``POST /v1/monitor/attest``
    :class:`MonitorChallenge` -> ``MonitorAttestation``
``GET /v1/monitor/ak``
    -> :class:`MonitorIdentity`
"""

from __future__ import annotations

import dataclasses
from typing import Any

from verifier.protocol.errors import FieldError, MalformedError
from verifier.protocol.messages._fields import (
    MAX_TPM_PUBLIC,
    Reader,
    b64,
    check_bytes,
    check_tpm_public,
    tpm_public,
)
from verifier.protocol.messages.registration import MAX_EK_CERTIFICATE
from verifier.protocol.monitor import MAX_NONCE, check_nonce
from verifier.protocol.tpm import TpmPublic

__all__ = ["MonitorChallenge", "MonitorIdentity"]

_PCR_COUNT = 24


@dataclasses.dataclass(frozen=True)
class MonitorChallenge:
    """A customer's fresh nonce (hex on the wire).

    Raises:
        FieldError: not bytes.
        MalformedError: not :data:`~verifier.protocol.monitor.MIN_NONCE` to
            :data:`~verifier.protocol.monitor.MAX_NONCE` bytes.
    """

    nonce: bytes

    _NAME = "monitor challenge"

    def __post_init__(self) -> None:
        if not isinstance(self.nonce, bytes):
            raise FieldError(self._NAME, "nonce", "must be bytes")
        check_nonce(self.nonce)

    def to_dict(self) -> dict[str, Any]:
        return {"nonce": self.nonce.hex()}

    @classmethod
    def from_dict(cls, data: object) -> MonitorChallenge:
        """Parse a request body, or the query of a GET (unknown fields are
        refused).

        Raises:
            MalformedError: as the constructor; FieldError: not hex.
        """
        r = Reader(data, cls._NAME)
        msg = cls(r.hex("nonce", MAX_NONCE))
        r.finish()
        return msg


@dataclasses.dataclass(frozen=True)
class MonitorIdentity:
    """The verifier host's TPM identity, for a customer to activate and pin.

    Attributes:
        ak_public: the host's attestation key.
        ek_public: its endorsement key.
        ek_certificate: the DER EK certificate, or None.
        pcrs: the PCRs quoted for customers (sorted, distinct).

    On the wire the AK's Name (``ak_name``, hex) comes along; a Name that is
    not the AK's is refused.

    Raises:
        FieldError: a field of the wrong type or size, or bad PCR indices.
        MalformedError: a key that is not a TPM2B_PUBLIC, or a wrong Name.
    """

    ak_public: TpmPublic
    ek_public: TpmPublic
    ek_certificate: bytes | None
    pcrs: tuple[int, ...]

    _NAME = "monitor identity"

    def __post_init__(self) -> None:
        check_tpm_public(self._NAME, "ak_public", self.ak_public)
        check_tpm_public(self._NAME, "ek_public", self.ek_public)
        check_bytes(
            self._NAME,
            "ek_certificate",
            self.ek_certificate,
            MAX_EK_CERTIFICATE,
            optional=True,
        )
        pcrs = self.pcrs
        if (
            not isinstance(pcrs, tuple)
            or not all(type(i) is int and 0 <= i < _PCR_COUNT for i in pcrs)
            or list(pcrs) != sorted(set(pcrs))
        ):
            raise FieldError(
                self._NAME, "pcrs", "must be distinct PCR indices 0..23 in order"
            )

    def to_dict(self) -> dict[str, Any]:
        cert = self.ek_certificate
        return {
            "ak_public": b64(self.ak_public.to_bytes()),
            "ak_name": self.ak_public.name.hex(),
            "ek_public": b64(self.ek_public.to_bytes()),
            "ek_certificate": b64(cert) if cert is not None else None,
            "pcrs": list(self.pcrs),
        }

    @classmethod
    def from_dict(cls, data: object) -> MonitorIdentity:
        """Parse the verifier's answer (unknown fields are ignored).

        Raises:
            MalformedError: as the constructor, or a field that is not base64.
        """
        r = Reader(data, cls._NAME)
        ak = tpm_public(cls._NAME, "ak_public", r.b64("ak_public", MAX_TPM_PUBLIC))
        ek = tpm_public(cls._NAME, "ek_public", r.b64("ek_public", MAX_TPM_PUBLIC))
        cert = r.optional_b64("ek_certificate", MAX_EK_CERTIFICATE)
        name = r.get("ak_name")
        if name is not None and name != ak.name.hex():
            raise MalformedError(cls._NAME, "'ak_name' is not the Name of 'ak_public'")
        pcrs = r.get("pcrs")
        if not isinstance(pcrs, list) or len(pcrs) > _PCR_COUNT:
            raise FieldError(cls._NAME, "pcrs", "must be a list of PCR indices")
        return cls(ak, ek, cert, tuple(pcrs))
