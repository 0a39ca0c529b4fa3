"""The IMA list writer lives in the product (the trial mode's kernel
stand-in, :mod:`node_agent.trial.ima`); tests import it from here."""

from node_agent.trial.ima import (
    boot_aggregate_entry,
    make_entry,
    pcr_values,
    to_ascii,
    to_binary,
)

__all__ = [
    "boot_aggregate_entry",
    "make_entry",
    "pcr_values",
    "to_ascii",
    "to_binary",
]
