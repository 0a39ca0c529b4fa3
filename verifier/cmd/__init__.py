"""Console scripts of the registrar and verifier."""
