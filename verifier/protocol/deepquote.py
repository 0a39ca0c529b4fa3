"""Deep quote: a vTPM quote vouched for by the host's TPM.

A companion vTPM is software on the compute host, so its quote alone says
nothing about the host. The deep quote pairs it with a quote of the host's
TPM (a hardware TPM in production; a swtpm stands in for it in tests) whose
qualifying data binds, under one verifier nonce:

* the vTPM's EK name (the vTPM the provider registered for the instance),
* the instance UUID,
* the exact vTPM quote (SHA-256 of its TPMS_ATTEST).

The verifier checks both quotes together (:func:`verify_deep_quote`): the
vTPM quote with the guest's AK over the plain nonce, then the host quote
with the host's AK over :func:`host_binding` of that nonce. A host quote
for another instance, another vTPM, another vTPM quote or an older nonce
fails the binding. Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid as uuid_mod
from collections.abc import Mapping
from typing import Any

from verifier.protocol.errors import EvidenceError, MalformedError
from verifier.protocol.policy import PcrPolicy
from verifier.protocol.quote import (
    AttestationKey,
    ClockState,
    Quote,
    QuoteVerdict,
    bind_nonce,
    verify_quote,
)
from verifier.protocol.tpm import TpmPublic

__all__ = ["DeepQuote", "DeepQuoteVerdict", "host_binding", "verify_deep_quote"]

_LABEL = b"trusted-cloud deep quote v1\x00"


def _uuid_bytes(instance_uuid: str) -> bytes:
    try:
        return uuid_mod.UUID(instance_uuid).bytes
    except (ValueError, AttributeError, TypeError):
        raise MalformedError("deep quote", f"not an instance UUID: {instance_uuid!r}")


def host_binding(
    nonce: bytes, vtpm_ek_name: bytes, instance_uuid: str, vtpm_attest: bytes
) -> bytes:
    """Qualifying data of the host quote in a deep quote.

    Args:
        nonce: the verifier's fresh nonce (the vTPM quote carries
            ``bind_nonce(nonce)``).
        vtpm_ek_name: the TPM name of the vTPM's EK (alg id || digest).
        instance_uuid: the Nova instance UUID.
        vtpm_attest: the TPMS_ATTEST of the vTPM quote being vouched for.

    Returns:
        32 bytes.
    """
    return bind_nonce(
        nonce,
        _LABEL,
        vtpm_ek_name,
        _uuid_bytes(instance_uuid),
        hashlib.sha256(vtpm_attest).digest(),
    )


@dataclasses.dataclass(frozen=True)
class DeepQuote:
    """The vTPM quote and the host quote vouching for it."""

    vtpm: Quote
    host: Quote

    def to_dict(self) -> dict[str, Any]:
        return {"vtpm_quote": self.vtpm.to_dict(), "host_quote": self.host.to_dict()}

    @classmethod
    def from_dict(cls, data: object) -> DeepQuote:
        """Raises: MalformedError."""
        if not isinstance(data, Mapping):
            raise MalformedError("deep quote", "must be an object")
        return cls(
            Quote.from_dict(data.get("vtpm_quote")),
            Quote.from_dict(data.get("host_quote")),
        )


@dataclasses.dataclass(frozen=True)
class DeepQuoteVerdict:
    """Both verdicts of a successful :func:`verify_deep_quote`."""

    vtpm: QuoteVerdict
    host: QuoteVerdict

    def __bool__(self) -> bool:
        return True


def verify_deep_quote(
    deep: DeepQuote,
    *,
    nonce: bytes,
    instance_uuid: str,
    vtpm_ek: TpmPublic,
    vtpm_ak: AttestationKey,
    vtpm_policy: PcrPolicy,
    host_ak: AttestationKey,
    host_policy: PcrPolicy,
    vtpm_previous_clock: ClockState | None = None,
    host_previous_clock: ClockState | None = None,
) -> DeepQuoteVerdict:
    """Verify a vTPM quote and the host quote that vouches for it.

    Args:
        deep: the two quotes.
        nonce: this request's fresh nonce.
        instance_uuid: the instance the verifier is attesting.
        vtpm_ek: the EK the provider registered for ``instance_uuid``.
        vtpm_ak: the guest AK, activated against ``vtpm_ek``.
        vtpm_policy: allowed guest PCR values.
        host_ak: the host TPM's AK as the registrar vouches for it.
        host_policy: allowed host PCR values (the host's trusted boot).
        vtpm_previous_clock: last accepted vTPM clock.
        host_previous_clock: last accepted host clock.

    Raises:
        EvidenceError: ``deep_quote_binding`` if the host quote does not
            bind this vTPM, instance, vTPM quote and nonce; otherwise the
            reason of the failed check of either quote.
        MalformedError: unparsable quote or UUID.
    """
    vtpm = verify_quote(
        deep.vtpm,
        ak=vtpm_ak,
        qualifying_data=bind_nonce(nonce),
        policy=vtpm_policy,
        previous_clock=vtpm_previous_clock,
    )
    expected = host_binding(nonce, vtpm_ek.name, instance_uuid, deep.vtpm.attest)
    try:
        host = verify_quote(
            deep.host,
            ak=host_ak,
            qualifying_data=expected,
            policy=host_policy,
            previous_clock=host_previous_clock,
        )
    except EvidenceError as exc:
        if exc.reason != "nonce_mismatch":
            raise
        raise EvidenceError(
            "deep_quote_binding",
            "the host quote does not vouch for this vTPM quote of instance "
            f"{instance_uuid} (vTPM EK, instance UUID, vTPM quote or nonce differ)",
        )
    return DeepQuoteVerdict(vtpm, host)
