"""TRIAL MODE: try IMA and measured-boot attestation on a machine whose
kernel cannot give the agent real evidence (a container, a laptop, a CI job).

A real node's agent reads the kernel's IMA list and the firmware's event
log, and its TPM's PCRs were extended by that firmware and that kernel.
Neither exists for a software TPM started by hand, so ``trusted-trial``
stands in for both (:mod:`node_agent.trial.cli`):

* ``trusted-trial tpm`` manufactures a software TPM (swtpm) with an EK
  certificate from a local CA and serves it, so the registrar's
  ``require_ek_certificate`` can be tried as deployed;
* ``trusted-trial boot`` writes an event log and an IMA list the way a
  firmware and a kernel do, extending that TPM's PCRs 0-7 and 10;
* ``trusted-trial run FILE`` measures a file the way IMA does before a
  program runs (one entry, PCR 10 extended): the tamper of the guide.

The agent reads those files with ``[agent] trial_dir``, says TRIAL MODE in
its log, and refuses the option with a hardware TPM (a ``device:`` TCTI):
trial evidence is evidence about files a user wrote, never about a machine.
"""

from __future__ import annotations

import os

from node_agent.exceptions import NodeAgentError

__all__ = ["EVENT_LOG", "IMA_LIST", "TrialModeError", "evidence_paths"]

#: the file names the kernel gives them under securityfs
IMA_LIST = "ascii_runtime_measurements"
EVENT_LOG = "binary_bios_measurements"


class TrialModeError(NodeAgentError):
    """The trial mode was asked for where it must not run."""


def evidence_paths(trial_dir: str, tcti: str) -> tuple[str, str]:
    """The IMA list and event log the agent sends in trial mode.

    Raises:
        TrialModeError: the TCTI is a hardware TPM's (``device:``).
    """
    if tcti.strip().startswith("device"):
        raise TrialModeError(
            f"[agent] trial_dir is for a software TPM; the TPM is {tcti!r}: a "
            "hardware TPM's evidence comes from the kernel (unset trial_dir)"
        )
    return os.path.join(trial_dir, IMA_LIST), os.path.join(trial_dir, EVENT_LOG)
