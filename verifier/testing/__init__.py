"""Test and benchmark helpers shared across packages (never used by servers)."""
