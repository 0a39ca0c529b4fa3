"""The registrar: binds a node UUID to its TPM (EK, EK certificate, AK).

Registration answers with a MakeCredential challenge for the AK under the
EK; the AK is trusted (``activated``) only after the node returns the
credential, proving that one TPM holds both keys.
"""

from verifier.registrar.app import make_app
from verifier.registrar.service import AgentRecord, Registrar, StoredProviderEk

__all__ = ["AgentRecord", "Registrar", "StoredProviderEk", "make_app"]
