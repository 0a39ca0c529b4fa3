"""The host's half of a deep quote (see :mod:`verifier.protocol.deepquote`).

The compute host quotes its own TPM over :func:`host_binding` of the
verifier's nonce, the vTPM's EK name, the instance UUID and the vTPM quote
the guest produced for that nonce.
"""

from __future__ import annotations

from collections.abc import Sequence

from verifier.common.tpm import Tpm
from verifier.protocol.deepquote import DeepQuote, host_binding
from verifier.protocol.quote import Quote
from verifier.protocol.tpm import TpmPublic

__all__ = ["host_quote"]


def host_quote(
    host_tpm: Tpm,
    nonce: bytes,
    vtpm_ek_public: bytes,
    instance_uuid: str,
    vtpm_quote: Quote,
    pcrs: Sequence[int],
) -> DeepQuote:
    """Vouch for ``vtpm_quote`` with the host TPM.

    Args:
        host_tpm: the host's TPM (its AK is registered for the host).
        nonce: the verifier's nonce of this request.
        vtpm_ek_public: the vTPM EK (TPM2B_PUBLIC) the provider registered.
        instance_uuid: the instance the vTPM belongs to.
        vtpm_quote: the guest's quote over ``bind_nonce(nonce)``.
        pcrs: host PCRs to quote.

    Raises:
        TpmError: the host TPM failed.
        MalformedError: bad EK bytes or UUID.
    """
    name = TpmPublic.from_bytes(vtpm_ek_public).name
    binding = host_binding(nonce, name, instance_uuid, vtpm_quote.attest)
    q = host_tpm.quote(binding, pcrs)
    return DeepQuote(vtpm_quote, Quote(q.attest, q.signature, dict(q.pcr_values)))
