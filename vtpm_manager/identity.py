"""A vTPM's endorsement key as the registrar records it under the
instance UUID: what the vTPM manager reads from the swtpm state on the
compute host (:mod:`vtpm_manager.swtpm_state`, needs tpm2-pytss) and what
the registrar client and the Nova listener's instance hook carry (no TPM,
no libvirt)."""

from __future__ import annotations

import dataclasses

__all__ = ["EkIdentity"]


@dataclasses.dataclass(frozen=True)
class EkIdentity:
    """A vTPM's endorsement key as the guest's agent will present it."""

    ek_public: bytes  # marshalled TPM2B_PUBLIC
    ek_certificate: bytes | None  # DER
