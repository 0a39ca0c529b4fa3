"""Build spec-conformant crypto-agile event logs, as a UEFI firmware writes
them: the trial mode's firmware stand-in (:mod:`node_agent.trial`) and the
tests' (there is no firmware log to read in a container).

Never used by the agent to judge or send real evidence.
"""

from __future__ import annotations

import hashlib
import struct
import uuid
from collections.abc import Sequence

from verifier.protocol.mb.eventlog import (
    ALGORITHMS,
    EV_EFI_BOOT_SERVICES_APPLICATION,
    EV_EFI_VARIABLE_DRIVER_CONFIG,
    EV_NO_ACTION,
    EV_S_CRTM_VERSION,
    EV_SEPARATOR,
    HASHLIB_NAMES,
    SPEC_ID_SIGNATURE,
)
from verifier.protocol.mb.policy import EFI_GLOBAL_VARIABLE
from verifier.protocol.mb.replay import STARTUP_LOCALITY

__all__ = [
    "LegacyLogWriter",
    "LogWriter",
    "efi_variable_data",
    "sample_log",
    "spec_id_data",
]

_ALG_IDS = {name: alg for alg, (name, _) in ALGORITHMS.items()}


def spec_id_data(banks: Sequence[str], vendor_info: bytes = b"") -> bytes:
    """A ``TCG_EfiSpecIDEvent`` (client platform, spec 2.0 errata 0, 64-bit
    UINTN) declaring ``banks``."""
    out = SPEC_ID_SIGNATURE + struct.pack("<IBBBBI", 0, 0, 2, 0, 2, len(banks))
    for name in banks:
        alg = _ALG_IDS[name]
        out += struct.pack("<HH", alg, ALGORITHMS[alg][1])
    return out + bytes([len(vendor_info)]) + vendor_info


def efi_variable_data(guid: uuid.UUID, name: str, data: bytes) -> bytes:
    """A ``UEFI_VARIABLE_DATA`` structure."""
    return (
        guid.bytes_le + struct.pack("<QQ", len(name), len(data))
        + name.encode("utf-16-le") + data
    )  # fmt: skip


class LogWriter:
    """Accumulates ``TCG_PCR_EVENT2`` events after the Spec ID event.

    Args:
        banks: the banks to log a digest for, in order.
        spec_id_pcr: the PCRIndex of the Spec ID event (0 in a TPM's log;
            other values stand for logs, such as a TDX CCEL, that number
            their registers differently).
    """

    def __init__(
        self, banks: Sequence[str] = ("sha1", "sha256"), spec_id_pcr: int = 0
    ) -> None:
        self.banks = tuple(banks)
        spec = spec_id_data(self.banks)
        self._out = bytearray(
            struct.pack("<II20sI", spec_id_pcr, EV_NO_ACTION, bytes(20), len(spec))
        )
        self._out += spec

    def add(
        self,
        pcr: int,
        event_type: int,
        data: bytes,
        measured: bytes | None = None,
        digests: dict[str, bytes] | None = None,
    ) -> LogWriter:
        """Append an event.

        Args:
            pcr: PCR index.
            event_type: ``EV_*`` value.
            data: the event data.
            measured: the bytes hashed into the digests (default ``data``;
                e.g. the PE image for a boot application).
            digests: explicit digests per bank (override ``measured``).
        """
        if digests is None:
            content = data if measured is None else measured
            names = {b: HASHLIB_NAMES.get(b, b) for b in self.banks}
            if event_type == EV_NO_ACTION:
                digests = {
                    b: bytes(hashlib.new(h).digest_size) for b, h in names.items()
                }
            else:
                digests = {
                    b: hashlib.new(h, content).digest() for b, h in names.items()
                }
        self._out += struct.pack("<III", pcr, event_type, len(digests))
        for name, digest in digests.items():
            self._out += struct.pack("<H", _ALG_IDS[name]) + digest
        self._out += struct.pack("<I", len(data)) + data
        return self

    def build(self) -> bytes:
        """The log bytes."""
        return bytes(self._out)


class LegacyLogWriter:
    """Accumulates ``TCG_PCR_EVENT`` entries: a legacy SHA-1 log (TCG 1.2
    format, no Spec ID Event03), as TPM 1.2 and many TPM 2.0 firmwares
    write it."""

    def __init__(self) -> None:
        self._out = bytearray()

    def add(
        self, pcr: int, event_type: int, data: bytes, measured: bytes | None = None
    ) -> LegacyLogWriter:
        """Append an event whose digest is SHA-1 of ``measured`` (default
        ``data``; all zero for ``EV_NO_ACTION``)."""
        content = data if measured is None else measured
        digest = (
            bytes(20)
            if event_type == EV_NO_ACTION
            else hashlib.sha1(content, usedforsecurity=False).digest()
        )
        self._out += struct.pack("<II20sI", pcr, event_type, digest, len(data)) + data
        return self

    def build(self) -> bytes:
        """The log bytes."""
        return bytes(self._out)


def sample_log(
    secure_boot: bool = True,
    bootloader: bytes = b"grubx64.efi image",
    kernel: bytes = b"vmlinuz image",
    locality: int | None = 3,
    banks: Sequence[str] = ("sha1", "sha256"),
) -> bytes:
    """A small, typical UEFI boot log.

    StartupLocality (optional), CRTM version, the SecureBoot variable,
    separators in PCRs 0-7, then two boot applications in PCR 4.
    """
    log = LogWriter(banks)
    if locality is not None:
        log.add(0, EV_NO_ACTION, STARTUP_LOCALITY + bytes([locality]))
    log.add(0, EV_S_CRTM_VERSION, "1.0".encode("utf-16-le") + b"\0\0")
    log.add(
        7,
        EV_EFI_VARIABLE_DRIVER_CONFIG,
        efi_variable_data(
            EFI_GLOBAL_VARIABLE, "SecureBoot", b"\x01" if secure_boot else b"\x00"
        ),
    )
    for pcr in range(8):
        log.add(pcr, EV_SEPARATOR, b"\0\0\0\0")
    # EFI_IMAGE_LOAD_EVENT contents are opaque to the parser: a stand-in.
    log.add(4, EV_EFI_BOOT_SERVICES_APPLICATION, b"\0" * 32, measured=bootloader)
    log.add(4, EV_EFI_BOOT_SERVICES_APPLICATION, b"\1" * 32, measured=kernel)
    return log.build()
