"""The software CA.

It issues the services' mTLS certificates (``trusted-certs``) and, for each
node that passes its first integrity quote, an X.509 identity from a CSR the
node committed to inside that quote.
"""

from verifier.ca._authority import CaError, CertificateAuthority

__all__ = ["CaError", "CertificateAuthority"]
