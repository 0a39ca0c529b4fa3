"""Policy-sealed data (Excalibur) with CP-ABE over BLS12-381.

Bethencourt-Sahai-Waters 2007, "Ciphertext-Policy Attribute-Based
Encryption", on the BLS12-381 pairing (about 120-bit security) via pymcl
(mcl). Data sealed to a policy over node attributes, e.g.
``region=eu and (hv=kvm-9 or hv=xen-4.5)``, opens with any key whose
attributes satisfy the policy, including keys issued later, and with
nothing else; keys of several nodes do not combine.

* :mod:`~verifier.protocol.abe.policy` -- the strict policy language;
* :mod:`~verifier.protocol.abe.bsw07` -- the CP-ABE scheme and the
  canonical serialization of its keys and ciphertexts;
* :mod:`~verifier.protocol.abe.seal` -- hybrid sealing (CP-ABE key
  encapsulation, HKDF-SHA256, AES-256-GCM).

Pure: no I/O.
"""

from verifier.protocol.abe.bsw07 import (
    Ciphertext,
    MasterKey,
    PublicParams,
    SecretKey,
    decapsulate,
    decrypt,
    encapsulate,
    encrypt,
    keygen,
    setup,
)
from verifier.protocol.abe.errors import AbeError, PolicyError, SealIntegrityError
from verifier.protocol.abe.policy import (
    Attribute,
    Gate,
    parse_attribute,
    parse_attributes,
    parse_policy,
    satisfies,
)
from verifier.protocol.abe.seal import SealedBlob, seal, unseal

__all__ = [
    "AbeError",
    "Attribute",
    "Ciphertext",
    "Gate",
    "MasterKey",
    "PolicyError",
    "PublicParams",
    "SealIntegrityError",
    "SealedBlob",
    "SecretKey",
    "decapsulate",
    "decrypt",
    "encapsulate",
    "encrypt",
    "keygen",
    "parse_attribute",
    "parse_attributes",
    "parse_policy",
    "satisfies",
    "seal",
    "setup",
    "unseal",
]
