"""Stands in for a node's firmware and kernel in tests: writes the UEFI
event log and the IMA measurement list the way they do, extending the
node's (software or swtpm) TPM as they would.

The TPM is reached through ``extend(pcr, sha256_digest)`` and
``read(pcrs)`` callables, so the same soft kernel drives a
:class:`~trusted_testing.softtpm.SoftTpm` in unit tests and a swtpm
(through :class:`verifier.common.tpm.Tpm`) in functional tests. Only the sha256
bank is extended: it is the one our quotes select.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence

from node_agent.trial.eventlog import sample_log
from node_agent.trial.ima import boot_aggregate_entry, make_entry
from verifier.protocol.ima import ImaEntry
from verifier.protocol.mb import parse
from verifier.protocol.mb.eventlog import EV_NO_ACTION

__all__ = ["BOOTLOADER", "KERNEL", "SoftKernel"]

BOOTLOADER = b"grubx64.efi of the golden image"
KERNEL = b"vmlinuz of the golden image"

Extend = Callable[[int, bytes], None]
Read = Callable[[Sequence[int]], Mapping[int, bytes]]


class SoftKernel:
    """Firmware + kernel of one test node.

    Args:
        extend: extends a sha256 PCR of the node's TPM.
        read: reads sha256 PCRs of the node's TPM.
        directory: where ``ascii_runtime_measurements`` and
            ``binary_bios_measurements`` are written.
    """

    def __init__(self, extend: Extend, read: Read, directory: str) -> None:
        self._extend = extend
        self._read = read
        self.ima_path = os.path.join(directory, "ascii_runtime_measurements")
        self.mb_path = os.path.join(directory, "binary_bios_measurements")
        self.entries: list[ImaEntry] = []

    def boot(self, secure_boot: bool = True, kernel: bytes = KERNEL) -> None:
        """Firmware measures the boot chain into PCRs 0-7 (and logs it),
        then the kernel starts IMA with its boot aggregate."""
        log = sample_log(
            secure_boot=secure_boot, bootloader=BOOTLOADER, kernel=kernel, locality=None
        )
        with open(self.mb_path, "wb") as f:
            f.write(log)
        for event in parse(log).events:
            if event.event_type != EV_NO_ACTION:
                self._extend(event.pcr, event.digests["sha256"])
        values = self._read(list(range(10)))
        self.entries = []
        open(self.ima_path, "w").close()
        self._log(boot_aggregate_entry([values[i] for i in range(10)]))

    def measure(self, path: str, content: bytes) -> ImaEntry:
        """The kernel measures a file it is about to run: append, then
        extend PCR 10."""
        entry = make_entry(path, content)
        self._log(entry)
        return entry

    def log_only(self, path: str, content: bytes) -> ImaEntry:
        """Append an entry without extending the TPM (a forged list)."""
        entry = make_entry(path, content)
        self.entries.append(entry)
        with open(self.ima_path, "a", encoding="utf-8", errors="surrogateescape") as f:
            f.write(entry.to_ascii() + "\n")
        return entry

    def _log(self, entry: ImaEntry) -> None:
        self.entries.append(entry)
        with open(self.ima_path, "a", encoding="utf-8", errors="surrogateescape") as f:
            f.write(entry.to_ascii() + "\n")
        self._extend(10, hashlib.sha256(entry.template_data).digest())

    @staticmethod
    def golden_mb_policy() -> dict[str, object]:
        """The measured-boot policy the golden image passes."""
        return {
            "secure_boot": True,
            "boot_applications": [
                hashlib.sha256(BOOTLOADER).hexdigest(),
                hashlib.sha256(KERNEL).hexdigest(),
            ],
        }
