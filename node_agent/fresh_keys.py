"""The keys a node agent makes afresh at each start.

* NK, an X25519 share-transport key: the tenant seals share U and the
  verifier seals share V (and e.g. a CP-ABE key) to it, and the agent binds
  its public half into its quotes;
* a P-256 identity key and its CSR (CN = node UUID), bound into the first
  quote; the verifier's CA answers with the node's identity certificate,
  which must be for this key.

Both private keys stay in memory: only once the bootstrap releases the
payload is the identity key written beside its certificate, for the payload
to use (:class:`node_agent.payload.Installation`).
"""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, x25519
from cryptography.x509.oid import NameOID

from node_agent.exceptions import RefusedError
from verifier.protocol import ShareKind, open_share

__all__ = ["FreshKeys"]

_RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw
_SPKI = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo


class FreshKeys:
    """NK and the identity key (with its CSR) of one run of the agent.

    Args:
        uuid: the node UUID, canonical: the CSR's CN, and what an envelope
            sealed to NK must be bound to.
    """

    def __init__(self, uuid: str) -> None:
        self.uuid = uuid
        self._nk = x25519.X25519PrivateKey.generate()
        #: NK's public key (raw, 32 bytes)
        self.nk_public: bytes = self._nk.public_key().public_bytes(*_RAW)
        self._identity_key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, uuid)])
        #: the identity key's certificate request (DER)
        self.csr_der: bytes = (
            x509.CertificateSigningRequestBuilder()
            .subject_name(subject)
            .sign(self._identity_key, hashes.SHA256())
            .public_bytes(serialization.Encoding.DER)
        )

    def open(self, kind: ShareKind, envelope: bytes) -> bytes:
        """Open an envelope of ``kind`` sealed to NK.

        Raises:
            EnvelopeError: it does not authenticate for this node and kind.
        """
        return open_share(self._nk, envelope, kind, self.uuid)

    def check_identity_cert(self, pem: bytes) -> None:
        """Check that ``pem`` certifies the identity key.

        Raises:
            RefusedError: ``bad_field`` (not a PEM certificate) or
                ``bad_identity_cert`` (a certificate for another key).
        """
        try:
            cert = x509.load_pem_x509_certificate(pem)
        except ValueError:
            raise RefusedError("bad_field", "'identity_cert' is not a PEM certificate")
        ours = self._identity_key.public_key().public_bytes(*_SPKI)
        theirs = cert.public_key().public_bytes(*_SPKI)
        if ours != theirs:
            raise RefusedError(
                "bad_identity_cert", "identity certificate is not for this node's key"
            )

    def identity_key_pem(self) -> bytes:
        """The identity private key, PKCS#8 PEM without encryption."""
        return self._identity_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
