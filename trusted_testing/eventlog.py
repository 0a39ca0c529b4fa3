"""The event-log writer lives in the product (the trial mode's firmware
stand-in, :mod:`node_agent.trial.eventlog`); tests import it from here."""

from node_agent.trial.eventlog import (
    LegacyLogWriter,
    LogWriter,
    efi_variable_data,
    sample_log,
    spec_id_data,
)

__all__ = [
    "LegacyLogWriter",
    "LogWriter",
    "efi_variable_data",
    "sample_log",
    "spec_id_data",
]
