"""Internals of the ``ipsec`` action: the CRL, the peer mappings and the
swanctl configuration they render to."""
