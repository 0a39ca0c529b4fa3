"""Console scripts of :mod:`ipsec_puppet_vault_hooks`."""
