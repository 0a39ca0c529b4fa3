"""The node side of a :class:`~trusted_testing.cluster.LocalCluster`: a
node's handle (its swtpm, agent process and work directory), the PCR the
soft kernel measures into and its expected values, and the soft kernel
bound to the node's swtpm."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trusted_testing.softkernel import SoftKernel
from trusted_testing.swtpm import Swtpm
from verifier.common.errors import TpmError
from verifier.common.tpm import Tpm

__all__ = [
    "GOLDEN_MEASUREMENT",
    "PCR",
    "ROOTKIT_MEASUREMENT",
    "NodeHandle",
    "expected_pcr",
    "says",
    "soft_kernel",
]

GOLDEN_MEASUREMENT = hashlib.sha256(b"trusted-cloud demo: golden boot image").digest()
ROOTKIT_MEASUREMENT = hashlib.sha256(b"unexpected kernel module").digest()
PCR = 16


def expected_pcr(*measurements: bytes) -> bytes:
    """The sha256 PCR value after extending ``measurements`` from zero."""
    value = bytes(32)
    for m in measurements:
        value = hashlib.sha256(value + m).digest()
    return value


@dataclasses.dataclass
class NodeHandle:
    uuid: str
    index: int
    dir: str
    swtpm: Swtpm
    port: int
    proc: subprocess.Popen[bytes] | None = None
    kernel: SoftKernel | None = None
    #: ``[agent]`` options over the cluster's defaults (None: drop one)
    agent_options: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def work_dir(self) -> str:
        return os.path.join(self.dir, "work")

    @property
    def log(self) -> str:
        return os.path.join(self.dir, "agent.log")

    def payload_output(self) -> str | None:
        try:
            with open(
                os.path.join(self.work_dir, "payload.out"), encoding="utf-8"
            ) as f:
                return f.read()
        except OSError:
            return None

    def payload_status(self) -> dict[str, Any] | None:
        try:
            with open(
                os.path.join(self.work_dir, "payload.status"), encoding="utf-8"
            ) as f:
                return dict(json.load(f))
        except (OSError, ValueError):
            return None


def soft_kernel(tcti: str, directory: str) -> SoftKernel:
    """A soft kernel measuring into the swtpm at ``tcti``."""

    # The agent uses the same swtpm (no resource manager): opening it while
    # the agent works can race with its transient handles; try again.
    def with_tpm(work: Callable[[Tpm], Any]) -> Any:
        for attempt in range(5):
            try:
                with Tpm(tcti) as tpm:
                    return work(tpm)
            except TpmError:
                if attempt == 4:
                    raise
                time.sleep(0.1)

    def extend(index: int, digest: bytes) -> None:
        with_tpm(lambda tpm: tpm.pcr_extend(index, digest))

    def read(pcrs: Sequence[int]) -> Mapping[int, bytes]:
        return dict(with_tpm(lambda tpm: tpm.pcr_read(pcrs)))

    return SoftKernel(extend, read, directory)


def says(log: str, text: str) -> bool:
    """Whether the log file ``log`` contains ``text`` yet."""
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            return text in f.read()
    except OSError:
        return False
