"""Registrar, cloud verifier, software CA, revocation events, and the pure
protocol core (:mod:`verifier.protocol`)."""

__all__: list[str] = []
