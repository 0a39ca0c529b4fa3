"""The TCG boot event log (measured boot), in both of its formats.

Parses the binary log the kernel exposes as
``/sys/kernel/security/tpm0/binary_bios_measurements`` (TCG PC Client
Platform Firmware Profile, section 10). All integers are little-endian.

* **crypto-agile** (:data:`CRYPTO_AGILE`): a legacy SHA-1 ``TCG_PCR_EVENT``
  carrying the ``Spec ID Event03`` header (``TCG_EfiSpecIDEvent``), then
  ``TCG_PCR_EVENT2`` entries with one digest per PCR bank;
* **legacy SHA-1** (:data:`LEGACY_SHA1`): ``TCG_PCR_EVENT`` entries only
  (PCR index, event type, one SHA-1 digest, event data), with no Spec ID
  Event03 -- written by TPM 1.2 firmware and by many TPM 2.0 firmwares
  (and Hyper-V shielded VMs) that log in the TCG 1.2 format. Its first
  event may be a TPM 1.2 ``Spec ID Event00``/``02`` header, a
  ``StartupLocality`` event, or an ordinary measurement; a log may hold a
  ``StartupLocality`` event and nothing else.

The format is told by the first event's data, not by its PCR index: a log
whose first event carries the ``Spec ID Event03`` signature is crypto-agile
wherever that event says it goes (a TDX CCEL log numbers its measurement
registers differently from a TPM's PCRs).

An event whose PCRIndex is ``0xFFFFFFFF`` (:data:`NOT_EXTENDED`) was logged
but extended into no PCR (PFP section 10.4.5: ``EV_NO_ACTION`` variants and
some platforms' informational events); it is parsed and never replayed
(:attr:`Event.extended`).

Errors name the format seen, the index of the offending event and the field
of the structure (``PCRIndex``, ``EventSize``, ``digests[1].AlgorithmId``,
``numberOfAlgorithms``...). Bank
names are the TCG's (``sm3_256`` for ``TPM_ALG_SM3_256``; hashlib calls it
``sm3``, see :data:`HASHLIB_NAMES`).

Pure and I/O-free like the rest of :mod:`verifier.protocol`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import struct
import uuid

from verifier.protocol.errors import MalformedError

__all__ = [
    "ALGORITHMS",
    "CRYPTO_AGILE",
    "EVENT_TYPE_NAMES",
    "HASHLIB_NAMES",
    "LEGACY_SHA1",
    "NOT_EXTENDED",
    "EV_EFI_ACTION",
    "EV_EFI_BOOT_SERVICES_APPLICATION",
    "EV_EFI_BOOT_SERVICES_DRIVER",
    "EV_EFI_GPT_EVENT",
    "EV_EFI_HANDOFF_TABLES",
    "EV_EFI_HCRTM_EVENT",
    "EV_EFI_PLATFORM_FIRMWARE_BLOB",
    "EV_EFI_PLATFORM_FIRMWARE_BLOB2",
    "EV_EFI_VARIABLE_AUTHORITY",
    "EV_EFI_VARIABLE_BOOT",
    "EV_EFI_VARIABLE_DRIVER_CONFIG",
    "EV_NO_ACTION",
    "EV_SEPARATOR",
    "EV_S_CRTM_VERSION",
    "EfiVariable",
    "Event",
    "EventLog",
    "SpecIdEvent",
    "event_type_name",
    "parse",
    "parse_efi_variable",
]

EV_PREBOOT_CERT = 0x0
EV_POST_CODE = 0x1
EV_UNUSED = 0x2
EV_NO_ACTION = 0x3
EV_SEPARATOR = 0x4
EV_ACTION = 0x5
EV_EVENT_TAG = 0x6
EV_S_CRTM_CONTENTS = 0x7
EV_S_CRTM_VERSION = 0x8
EV_CPU_MICROCODE = 0x9
EV_PLATFORM_CONFIG_FLAGS = 0xA
EV_TABLE_OF_DEVICES = 0xB
EV_COMPACT_HASH = 0xC
EV_IPL = 0xD
EV_IPL_PARTITION_DATA = 0xE
EV_NONHOST_CODE = 0xF
EV_NONHOST_CONFIG = 0x10
EV_NONHOST_INFO = 0x11
EV_OMIT_BOOT_DEVICE_EVENTS = 0x12
EV_EFI_VARIABLE_DRIVER_CONFIG = 0x80000001
EV_EFI_VARIABLE_BOOT = 0x80000002
EV_EFI_BOOT_SERVICES_APPLICATION = 0x80000003
EV_EFI_BOOT_SERVICES_DRIVER = 0x80000004
EV_EFI_RUNTIME_SERVICES_DRIVER = 0x80000005
EV_EFI_GPT_EVENT = 0x80000006
EV_EFI_ACTION = 0x80000007
EV_EFI_PLATFORM_FIRMWARE_BLOB = 0x80000008
EV_EFI_HANDOFF_TABLES = 0x80000009
EV_EFI_PLATFORM_FIRMWARE_BLOB2 = 0x8000000A
EV_EFI_HANDOFF_TABLES2 = 0x8000000B
EV_EFI_VARIABLE_BOOT2 = 0x8000000C
EV_EFI_HCRTM_EVENT = 0x80000010
EV_EFI_VARIABLE_AUTHORITY = 0x800000E0
EV_EFI_SPDM_FIRMWARE_BLOB = 0x800000E1
EV_EFI_SPDM_FIRMWARE_CONFIG = 0x800000E2

#: Event type -> its ``EV_*`` name.
EVENT_TYPE_NAMES: dict[int, str] = {
    value: name
    for name, value in sorted(globals().items())
    if name.startswith("EV_") and isinstance(value, int)
}

#: TPM_ALG_ID -> (name, digest size).
ALGORITHMS: dict[int, tuple[str, int]] = {
    0x0004: ("sha1", 20),
    0x000B: ("sha256", 32),
    0x000C: ("sha384", 48),
    0x000D: ("sha512", 64),
    0x0012: ("sm3_256", 32),
}

#: TCG bank name -> hashlib name, where they differ.
HASHLIB_NAMES = {"sm3_256": "sm3"}
#: :attr:`EventLog.format` of a log with the Spec ID Event03 header.
CRYPTO_AGILE = "crypto-agile"
#: :attr:`EventLog.format` of a log of ``TCG_PCR_EVENT`` entries only.
LEGACY_SHA1 = "legacy SHA-1"

#: EFI variable events whose data is a ``UEFI_VARIABLE_DATA``.
VARIABLE_EVENTS = frozenset(
    {
        EV_EFI_VARIABLE_DRIVER_CONFIG,
        EV_EFI_VARIABLE_BOOT,
        EV_EFI_VARIABLE_BOOT2,
        EV_EFI_VARIABLE_AUTHORITY,
    }
)

SPEC_ID_SIGNATURE = b"Spec ID Event03\x00"
#: The PCRIndex of an event extended into no PCR.
NOT_EXTENDED = 0xFFFFFFFF
#: The highest PCR index an extending event may name.
MAX_PCR = 31
_STRUCT = "TCG event log"
_MAX_EVENT_SIZE = 16 * 1024 * 1024
_MAX_DIGESTS = 16
_LEGACY_HEADER = struct.Struct("<II20sI")
_AGILE = f"{CRYPTO_AGILE} log"
_LEGACY = f"{LEGACY_SHA1} log (no Spec ID Event03)"


def event_type_name(event_type: int) -> str:
    """``EV_*`` name of ``event_type``, or ``EV_UNKNOWN_0x...``."""
    return EVENT_TYPE_NAMES.get(event_type, f"EV_UNKNOWN_{event_type:#x}")


@dataclasses.dataclass(frozen=True, slots=True)
class EfiVariable:
    """A ``UEFI_VARIABLE_DATA`` structure.

    Attributes:
        guid: the vendor GUID (``VariableName``).
        name: the variable's Unicode name (e.g. ``SecureBoot``).
        data: the variable's value.
    """

    guid: uuid.UUID
    name: str
    data: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class SpecIdEvent:
    """The ``TCG_EfiSpecIDEvent`` header of a crypto-agile log.

    Attributes:
        platform_class: ``platformClass`` (0 client, 1 server).
        spec_version: ``(major, minor, errata)``.
        uintn_size: ``uintnSize`` (1 for 32-bit UINTN, 2 for 64-bit).
        digest_sizes: TPM_ALG_ID -> digest size, in log order.
        vendor_info: ``vendorInfo`` bytes.
    """

    platform_class: int
    spec_version: tuple[int, int, int]
    uintn_size: int
    digest_sizes: dict[int, int]
    vendor_info: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """One event of the log.

    Attributes:
        index: position in the log (0 is the Spec ID event).
        pcr: the PCR index extended (:data:`NOT_EXTENDED` for none).
        event_type: the raw ``EV_*`` value.
        digests: bank name (``sha1``, ``sha256``...) -> logged digest.
        data: the event data.
    """

    index: int
    pcr: int
    event_type: int
    digests: dict[str, bytes]
    data: bytes

    @property
    def type_name(self) -> str:
        """The ``EV_*`` name of :attr:`event_type`."""
        return event_type_name(self.event_type)

    @property
    def extended(self) -> bool:
        """Whether the event was extended into :attr:`pcr`: not for
        ``EV_NO_ACTION`` events nor for PCRIndex :data:`NOT_EXTENDED`."""
        return self.event_type != EV_NO_ACTION and self.pcr != NOT_EXTENDED

    def data_matches_digest(self) -> bool:
        """Whether :attr:`data` hashes to the logged digest, for events
        whose whole data is what was measured (EFI variables, GRUB's
        strings): their data is believed only then. The sha256 digest is
        used, or the sha1 one of a legacy SHA-1 log that has no other."""
        for bank in ("sha256", "sha1"):
            digest = self.digests.get(bank)
            if digest is not None:
                mine = hashlib.new(bank, self.data).digest()
                return hmac.compare_digest(mine, digest)
        return False

    @property
    def variable(self) -> EfiVariable | None:
        """The parsed ``UEFI_VARIABLE_DATA`` of an EFI variable event.

        Raises:
            MalformedError: the data of a variable event does not parse.
        """
        if self.event_type not in VARIABLE_EVENTS:
            return None
        return parse_efi_variable(self.data, where=f"event {self.index}")


@dataclasses.dataclass(frozen=True, slots=True)
class EventLog:
    """A parsed log.

    Attributes:
        spec_id: the Spec ID Event03 header (None in a legacy SHA-1 log).
        events: every event, the header event included (index 0).
        format: :data:`CRYPTO_AGILE` or :data:`LEGACY_SHA1`.
    """

    spec_id: SpecIdEvent | None
    events: tuple[Event, ...]
    format: str = CRYPTO_AGILE

    @property
    def banks(self) -> tuple[str, ...]:
        """Names of the banks the log has digests of (known algorithms
        only): ``("sha1",)`` for a legacy SHA-1 log."""
        if self.spec_id is None:
            return ("sha1",)
        return tuple(
            ALGORITHMS[alg][0] for alg in self.spec_id.digest_sizes if alg in ALGORITHMS
        )


def parse_efi_variable(data: bytes, where: str = "event") -> EfiVariable:
    """Parse a ``UEFI_VARIABLE_DATA``.

    Raises:
        MalformedError: truncated, trailing bytes or a bad name, naming
            ``where`` and the field.
    """
    structure = "UEFI_VARIABLE_DATA"
    if len(data) < 32:
        raise MalformedError(
            structure,
            f"{where}: VariableName, UnicodeNameLength, VariableDataLength: "
            f"truncated ({len(data)} of 32 bytes)",
        )
    name_len, data_len = struct.unpack_from("<QQ", data, 16)
    end = 32 + 2 * name_len + data_len
    if end != len(data):
        raise MalformedError(
            structure,
            f"{where}: UnicodeNameLength {name_len} and VariableDataLength "
            f"{data_len} give {end} bytes, the event data has {len(data)}",
        )
    try:
        name = data[32 : 32 + 2 * name_len].decode("utf-16-le")
    except UnicodeDecodeError:
        raise MalformedError(structure, f"{where}: UnicodeName: not UTF-16") from None
    return EfiVariable(
        uuid.UUID(bytes_le=bytes(data[:16])), name, bytes(data[32 + 2 * name_len :])
    )


class _Fault:
    """Builds the errors of one event: ``<format> log: event <i>: ...``."""

    __slots__ = ("prefix",)

    def __init__(self, fmt: str, index: int, what: str = "") -> None:
        self.prefix = f"{fmt}: event {index}{what}"

    def __call__(self, field: str, problem: str) -> MalformedError:
        return MalformedError(_STRUCT, f"{self.prefix}: {field}: {problem}")


def _u32(view: memoryview, off: int, fault: _Fault, field: str) -> int:
    if off + 4 > len(view):
        raise fault(field, f"truncated ({len(view) - off} of 4 bytes)")
    value: int = struct.unpack_from("<I", view, off)[0]
    return value


def _check_pcr(pcr: int, fault: _Fault) -> None:
    if pcr > MAX_PCR and pcr != NOT_EXTENDED:
        raise fault(
            "PCRIndex",
            f"{pcr:#x} is not a PCR (0-{MAX_PCR}, or {NOT_EXTENDED:#x} for an "
            "event extended into none)",
        )


def _event_data(view: memoryview, off: int, size: int, fault: _Fault) -> bytes:
    if size > _MAX_EVENT_SIZE or off + size > len(view):
        raise fault(
            "EventSize", f"{size} exceeds the log ({len(view) - off} bytes left)"
        )
    return bytes(view[off : off + size])


def _parse_spec_id(data: bytes) -> SpecIdEvent:
    fault = _Fault(_AGILE, 0, " (Spec ID Event03)")
    if len(data) < 28:
        raise fault(
            "platformClass, specVersion, uintnSize, numberOfAlgorithms",
            f"truncated ({len(data)} of 28 bytes)",
        )
    platform_class, minor, major, errata, uintn, count = struct.unpack_from(
        "<IBBBBI", data, 16
    )
    if not 1 <= count <= _MAX_DIGESTS:
        raise fault("numberOfAlgorithms", f"{count} is not 1-{_MAX_DIGESTS}")
    off = 28
    sizes: dict[int, int] = {}
    for i in range(count):
        field = f"digestSizes[{i}]"
        if off + 4 > len(data):
            raise fault(field, f"truncated (declares {count} algorithms)")
        alg, size = struct.unpack_from("<HH", data, off)
        off += 4
        known = ALGORITHMS.get(alg)
        if alg in sizes:
            raise fault(field, f"algorithmId {alg:#06x} declared twice")
        if size == 0 or (known is not None and known[1] != size):
            raise fault(field, f"digestSize {size} is wrong for {alg:#06x}")
        sizes[alg] = size
    if off + 1 > len(data):
        raise fault("vendorInfoSize", "truncated")
    vendor_len = data[off]
    if off + 1 + vendor_len != len(data):
        raise fault(
            "vendorInfoSize",
            f"{vendor_len} does not match the EventSize ({len(data) - off - 1} "
            "bytes left)",
        )
    return SpecIdEvent(
        platform_class,
        (major, minor, errata),
        uintn,
        sizes,
        bytes(data[off + 1 :]),
    )


def parse(raw: bytes) -> EventLog:
    """Parse a binary event log, crypto-agile or legacy SHA-1.

    The format is crypto-agile when the first event's data starts with the
    ``Spec ID Event03`` signature, whatever its PCRIndex; else legacy SHA-1.

    Args:
        raw: the log bytes. Trailing zero padding (some firmwares pad the
            log area) is ignored.

    Returns:
        The parsed log; :attr:`EventLog.format` says which format it is.

    Raises:
        MalformedError: a truncated or inconsistent event, naming the format
            seen, the event's index and the field.
    """
    view = memoryview(raw)
    header = _LEGACY_HEADER.size
    if len(view) < header:
        raise MalformedError(
            _STRUCT,
            f"event 0: truncated header ({len(view)} bytes in all): PCRIndex, "
            f"EventType, digest, EventSize take {header}",
        )
    if bytes(view[header : header + len(SPEC_ID_SIGNATURE)]) != SPEC_ID_SIGNATURE:
        return _parse_legacy(view)
    pcr, etype, sha1, size = _LEGACY_HEADER.unpack_from(view, 0)
    fault = _Fault(_AGILE, 0, " (Spec ID Event03)")
    if etype != EV_NO_ACTION:
        raise fault(
            "EventType", f"{event_type_name(etype)}, the Spec ID event is EV_NO_ACTION"
        )
    first = _event_data(view, header, size, fault)
    spec_id = _parse_spec_id(first)
    events = [Event(0, pcr, EV_NO_ACTION, {"sha1": sha1}, first)]
    sizes = spec_id.digest_sizes
    off = header + size
    while off < len(view):
        index = len(events)
        if not any(view[off:]):
            break  # zero padding after the last event
        event, off = _parse_event2(view, off, index, sizes)
        events.append(event)
    return EventLog(spec_id, tuple(events), CRYPTO_AGILE)


def _parse_legacy(view: memoryview) -> EventLog:
    """A log of ``TCG_PCR_EVENT`` entries only (see the module docstring)."""
    events: list[Event] = []
    off, end = 0, len(view)
    while off < end:
        index = len(events)
        if index and not any(view[off:]):
            break  # zero padding after the last event
        fault = _Fault(_LEGACY, index)
        pcr = _u32(view, off, fault, "PCRIndex")
        _check_pcr(pcr, fault)
        etype = _u32(view, off + 4, fault, "EventType")
        if off + 28 > end:
            raise fault("digest", f"truncated ({end - off - 8} of 20 bytes)")
        sha1 = bytes(view[off + 8 : off + 28])
        size = _u32(view, off + 28, fault, "EventSize")
        off += _LEGACY_HEADER.size
        data = _event_data(view, off, size, fault)
        off += size
        events.append(Event(index, pcr, etype, {"sha1": sha1}, data))
    return EventLog(None, tuple(events), LEGACY_SHA1)


def _parse_event2(
    view: memoryview, off: int, index: int, sizes: dict[int, int]
) -> tuple[Event, int]:
    fault = _Fault(_AGILE, index)
    end = len(view)
    pcr = _u32(view, off, fault, "PCRIndex")
    _check_pcr(pcr, fault)
    etype = _u32(view, off + 4, fault, "EventType")
    count = _u32(view, off + 8, fault, "digests.count")
    off += 12
    if count > _MAX_DIGESTS:
        raise fault("digests.count", f"{count} is more than {_MAX_DIGESTS}")
    digests: dict[str, bytes] = {}
    for i in range(count):
        if off + 2 > end:
            raise fault(f"digests[{i}].hashAlg", "truncated")
        (alg,) = struct.unpack_from("<H", view, off)
        off += 2
        size = sizes.get(alg)
        if size is None:
            raise fault(
                f"digests[{i}].hashAlg",
                f"{alg:#06x} is not declared by the Spec ID event",
            )
        if off + size > end:
            raise fault(
                f"digests[{i}].digest", f"truncated ({end - off} of {size} bytes)"
            )
        name = ALGORITHMS.get(alg, (f"alg_{alg:#06x}", size))[0]
        if name in digests:
            raise fault(f"digests[{i}].hashAlg", f"a second {name} digest")
        digests[name] = bytes(view[off : off + size])
        off += size
    size = _u32(view, off, fault, "EventSize")
    off += 4
    data = _event_data(view, off, size, fault)
    return Event(index, pcr, etype, digests, data), off + size
