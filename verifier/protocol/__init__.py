"""The pure protocol core: bytes in, verdict out.

No I/O, no clock it is not given, no configuration. Everything else in the
project imports this package; it imports nothing of ours.
"""

from verifier.protocol.credential import CredentialChallenge, make_credential
from verifier.protocol.envelope import (
    ShareKind,
    canonical_uuid,
    open_payload,
    open_share,
    seal_payload,
    seal_share,
)
from verifier.protocol.errors import (
    EnvelopeError,
    EvidenceError,
    MalformedError,
    ProtocolError,
)
from verifier.protocol.events import RevocationEvent, SignedEvent
from verifier.protocol.policy import PcrPolicy
from verifier.protocol.quote import (
    AttestationKey,
    ClockState,
    Quote,
    QuoteVerdict,
    bind_nonce,
    check_ak_template,
    verify_quote,
)
from verifier.protocol.shares import combine, generate_key, split
from verifier.protocol.tpm import TpmAttest, TpmPublic, TpmSignature

__all__ = [
    "AttestationKey",
    "ClockState",
    "CredentialChallenge",
    "EnvelopeError",
    "EvidenceError",
    "MalformedError",
    "PcrPolicy",
    "ProtocolError",
    "Quote",
    "QuoteVerdict",
    "RevocationEvent",
    "ShareKind",
    "SignedEvent",
    "TpmAttest",
    "TpmPublic",
    "TpmSignature",
    "bind_nonce",
    "canonical_uuid",
    "check_ak_template",
    "combine",
    "generate_key",
    "make_credential",
    "open_payload",
    "open_share",
    "seal_payload",
    "seal_share",
    "split",
    "verify_quote",
]
