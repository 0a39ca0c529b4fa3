"""The agent's TCTI (``[agent] tcti``): checked at start, and the TSS
library's own log kept off the terminal.

tpm2-tss prints its own ``ERROR:tcti:...`` lines on stderr for every
failed attempt to open a TPM (four for a swtpm port where nothing listens)
unless ``TSS2_LOG`` says otherwise. The agent logs the one useful line
itself (:class:`verifier.common.tpm.Tpm` names the TCTI and the cause), so
:func:`quiet_tss_log` turns the library's log off unless the user set
``TSS2_LOG`` (``TSS2_LOG=all+debug`` brings it back for debugging). The
library reads the variable at its first log line, so this only has to
happen before the first TPM command.

A TCTI whose module cannot be loaded (``swtmp:...``) can never work: it
is a configuration error (exit status 2), found at start by
:func:`check_tcti` without opening the TPM. A configuration string the
module refuses (``swtpm:prt=2321``) is only found when the TPM is first
opened (:class:`verifier.common.errors.TctiConfigError`); the agent stops
then, with the same exit status.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from node_agent.exceptions import BootstrapError

__all__ = ["TSS2_LOG_QUIET", "check_tcti", "quiet_tss_log"]

#: Every tpm2-tss log module off.
TSS2_LOG_QUIET = "all+none"


def quiet_tss_log(environ: MutableMapping[str, str] = os.environ) -> None:
    """Turn tpm2-tss's own log off, unless ``TSS2_LOG`` is set already."""
    environ.setdefault("TSS2_LOG", TSS2_LOG_QUIET)


def check_tcti(tcti: str) -> None:
    """Check that the TCTI module ``tcti`` names can be loaded.

    Args:
        tcti: ``[agent] tcti``, e.g. ``swtpm:host=127.0.0.1,port=2321``.

    Raises:
        BootstrapError: no TCTI module of that name is installed.
    """
    from tpm2_pytss import TCTILdr

    name = tcti.partition(":")[0]
    if name and not TCTILdr.is_available(name):
        raise BootstrapError(
            f"[agent] tcti = {tcti}: no TCTI module {name!r} can be loaded "
            f"(libtss2-tcti-{name}.so.0); e.g. 'device:/dev/tpmrm0' or "
            "'swtpm:host=127.0.0.1,port=2321'"
        )
