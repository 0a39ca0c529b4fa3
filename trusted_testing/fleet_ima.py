"""IMA measurement lists for the fleet emulator (issue 19, "IMA under load").

Every emulated agent has an ima-ng measurement list that grows by
``per_quote`` new entries each time the verifier asks for a quote with IMA
entries (``ima_from``): the new entries are extended into the software
TPM's PCR 10 (sha256 bank, as the kernel does: sha256 of the template
data) before the quote, and the answer carries the list from the index the
verifier asked for, as the real agent does (:mod:`node_agent.evidence`:
the list read after the quote, at most ``max_bytes`` of it, ``more`` when
cut; an index past the end means a reboot and the list is sent from 0).

Entry 0 of every list is the boot aggregate; entry ``j >= 1`` measures
file ``(j - 1) % paths`` of a catalogue of ``paths`` files, so a list of
any length is allowed by the one runtime policy of :func:`policy_document`
(every catalogue path with its digest), shared by the whole fleet as a
tenant would share it. The catalogue's entries are built once and shared
by every agent; an agent keeps only its entry count (and its PCR 10).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from node_agent.trial.ima import boot_aggregate_entry, make_entry
from verifier.protocol.ima.log import IMA_PCR
from verifier.protocol.messages.quote import ImaPart

__all__ = [
    "BOOT_AGGREGATE_DIGEST",
    "POLICY_NAME",
    "ImaCatalogue",
    "ImaLoad",
    "file_digest",
    "file_path",
    "policy_document",
]

#: The runtime policy's name (version 1).
POLICY_NAME = "fleet-ima"
#: What the real agent sends at most per answer (its ``ima_max_bytes``).
DEFAULT_MAX_BYTES = 4 << 20
#: The boot aggregate every list starts with (PCRs 0-9 all zero: the
#: emulated TPMs extend none of them).
BOOT_AGGREGATE_DIGEST = hashlib.sha256(bytes(32 * 10)).digest()


def file_path(i: int) -> str:
    """The path of catalogue file ``i``."""
    return f"/usr/lib/x86_64-linux-gnu/fleet/pkg{i // 100}/lib{i}.so.1"


def file_digest(i: int) -> bytes:
    """The SHA-256 digest of catalogue file ``i``."""
    return hashlib.sha256(b"fleet file %d" % i).digest()


def policy_document(paths: int) -> dict[str, Any]:
    """The runtime policy (JSON form) allowing every catalogue file."""
    digests = {file_path(i): ["sha256:" + file_digest(i).hex()] for i in range(paths)}
    return {"name": POLICY_NAME, "version": 1, "digests": digests}


@dataclasses.dataclass(frozen=True)
class ImaLoad:
    """What the emulator's IMA lists look like.

    Attributes:
        per_quote: new entries per quote that asks for IMA (0: no IMA log,
            the agents answer ``ima_error`` as an agent without one does).
        paths: files in the catalogue (and paths in the policy).
        binary: serve ``binary_runtime_measurements``, the real agent's
            default ``ima_log_path`` (default here: the ascii list).
    """

    per_quote: int
    paths: int = 100_000
    binary: bool = False

    def to_args(self) -> list[str]:
        """The emulator's command-line arguments for this load."""
        args = ["--ima", str(self.per_quote), "--ima-paths", str(self.paths)]
        return args + (["--ima-binary"] if self.binary else [])


class ImaCatalogue:
    """The catalogue's entries in wire form and their PCR 10 extends.

    Args:
        load: the emulator's IMA load.
        max_bytes: the most list bytes one answer carries.
    """

    def __init__(self, load: ImaLoad, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if load.per_quote < 1 or load.paths < 1:
            raise ValueError("an IMA load needs entries per quote and paths")
        self.load = load
        self.max_bytes = max_bytes
        entries = [boot_aggregate_entry([bytes(32)] * 10)]
        entries += [
            make_entry(file_path(i), digest=file_digest(i)) for i in range(load.paths)
        ]
        #: the sha256-bank measurement of each entry (what PCR 10 is
        #: extended with)
        self.measurements = [hashlib.sha256(e.template_data).digest() for e in entries]
        self.wire: list[bytes] | list[str]
        if load.binary:
            self.wire = [e.to_binary() for e in entries]
        else:
            self.wire = [e.to_ascii() + "\n" for e in entries]

    def _slot(self, index: int) -> int:
        return 0 if index == 0 else 1 + (index - 1) % self.load.paths

    def grow(self, tpm: Any, count: int) -> int:
        """Append ``per_quote`` entries to a list of ``count`` entries:
        extend them into ``tpm``'s PCR 10; returns the new count."""
        measurements, slot = self.measurements, self._slot
        end = count + self.load.per_quote
        for index in range(count, end):
            tpm.extend(IMA_PCR, measurements[slot(index)])
        return end

    def part(self, first: int, count: int) -> ImaPart:
        """Entries ``first``.. of a list of ``count`` entries, as the real
        agent sends them (from 0 when ``first`` is past the end)."""
        if first > count:
            first = 0
        wire, slot, budget = self.wire, self._slot, self.max_bytes
        chunks: list[Any] = []
        size, index = 0, first
        while index < count:
            item = wire[slot(index)]
            if size + len(item) > budget:
                break
            chunks.append(item)
            size += len(item)
            index += 1
        more = index < count
        if self.load.binary:
            return ImaPart(first, b"".join(chunks), more)
        return ImaPart(first, "".join(chunks), more)
