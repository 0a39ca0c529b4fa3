"""What a node gets after its first good evidence (architecture flow 3):
V sealed to the share-transport key (NK) its quote bound, its identity
certificate signed by the verifier's CA from the CSR it sent, and the
enroller's commitment to U. Polling hands them to the agent
(:mod:`verifier.attest.pull`), push in the answer to the evidence
(:mod:`verifier.attest.push`).
"""

from __future__ import annotations

from verifier.attest.node import LiveNode
from verifier.attest.transitions import TransitionWriter
from verifier.ca import CaError, CertificateAuthority
from verifier.protocol import ShareKind, seal_share
from verifier.protocol.attestation import Verdict
from verifier.protocol.messages.shares import ShareV

__all__ = ["ShareRelease"]


class ShareRelease:
    """Makes the V message of a node that passed.

    Args:
        ca: issues node identities (None: no identities).
        transitions: revokes a node whose CSR the CA refuses.
    """

    def __init__(
        self, ca: CertificateAuthority | None, transitions: TransitionWriter
    ) -> None:
        self._ca = ca
        self._transitions = transitions

    def share_v(self, node: LiveNode, verdict: Verdict) -> ShareV | None:
        """V sealed to the quoted NK, the node's identity certificate (when
        the verifier has a CA and the node sent a CSR) and the enroller's
        commitment to U; None if the CSR was refused (the node is revoked)."""
        assert verdict.nk is not None  # a RELEASE_V verdict carries NK
        cert = None
        if self._ca is not None and verdict.csr is not None:
            try:
                cert = self._ca.sign_csr(verdict.csr, node.uuid).decode()
            except CaError as exc:
                self._transitions.act(node, node.revoke("csr", str(exc)))
                return None
        sealed = seal_share(verdict.nk, node.v_share, ShareKind.V, node.uuid)
        return ShareV(sealed, cert, node.u_commitment)
