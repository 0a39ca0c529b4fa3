"""The text the boot chain puts in the event log: GRUB's and shim's
``EV_IPL`` strings and shim's SBAT level.

* GRUB (``grub-core/commands/tpm.c``) logs, as ``EV_IPL`` events, every
  command it runs and the kernel command line in PCR 8 -- event data
  ``"grub_cmd: <command>\\0"``, ``"kernel_cmdline: <line>\\0"`` or
  ``"module_cmdline: <line>\\0"``, digest over ``<command>``/``<line>``
  only -- and every file it reads in PCR 9 (event data: the file name and
  a NUL, digest over the file's contents).
* shim logs its MOK variables in PCR 14 (``EV_IPL``, event data the
  variable's name and a NUL, digest over the variable's contents) and
  measures ``SbatLevel`` into PCR 7 (``EV_EFI_VARIABLE_AUTHORITY``): CSV
  text, a header line ``sbat,<version>,<datestamp>`` then one
  ``<component>,<generation>`` line per revoked component generation.

The logged text is not what the PCRs cover (only the digests are): PCR 8
strings are checked against their digest (:meth:`IplString.matches_digest`)
before a policy believes them.

Pure: malformed input raises
:class:`~verifier.protocol.errors.MalformedError` naming the event and field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac

from verifier.protocol.errors import MalformedError
from verifier.protocol.mb.eventlog import EV_IPL, Event

__all__ = [
    "GRUB_PREFIXES",
    "IplString",
    "SbatLevel",
    "ipl_string",
]

#: GRUB's PCR 8 prefixes, without their ": ".
GRUB_PREFIXES = ("grub_cmd", "kernel_cmdline", "module_cmdline")
_MAX_TEXT = 64 * 1024
_MAX_SBAT_LINES = 1024


@dataclasses.dataclass(frozen=True, slots=True)
class IplString:
    """The text of an ``EV_IPL`` event.

    Attributes:
        kind: ``grub_cmd``, ``kernel_cmdline``, ``module_cmdline``, or
            ``""`` for a plain string (a file name, a MOK variable name).
        text: the text after the prefix (the measured part).
    """

    kind: str
    text: str

    def matches_digest(self, event: Event) -> bool:
        """Whether the event's sha256 digest is the sha256 of :attr:`text`
        (what GRUB measures for a PCR 8 string)."""
        digest = event.digests.get("sha256")
        if digest is None:
            return False
        return hmac.compare_digest(
            hashlib.sha256(self.text.encode("utf-8")).digest(), digest
        )


def ipl_string(event: Event) -> IplString:
    """Decode an ``EV_IPL`` event's data as GRUB and shim write it.

    Raises:
        MalformedError: not an ``EV_IPL`` event, no terminating NUL, a NUL
            or a control character inside, not UTF-8, or over 64 KiB --
            naming the event index and the field.
    """
    where = f"event {event.index} (EV_IPL, PCR {event.pcr})"

    def bad(detail: str) -> MalformedError:
        return MalformedError("EV_IPL string", f"{where}: event data {detail}")

    if event.event_type != EV_IPL:
        raise MalformedError("EV_IPL string", f"{where}: not an EV_IPL event")
    data = event.data
    if len(data) > _MAX_TEXT:
        raise bad(f"is {len(data)} bytes, over {_MAX_TEXT}")
    if not data.endswith(b"\0"):
        raise bad("has no terminating NUL")
    body = data[:-1]
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad(f"is not UTF-8 at byte {exc.start}") from None
    for pos, char in enumerate(text):
        if ord(char) < 0x20 and char not in "\t\n" or char == "\x7f":
            raise bad(f"has control character {ord(char):#04x} at {pos}")
    for prefix in GRUB_PREFIXES:
        if text.startswith(prefix + ": "):
            return IplString(prefix, text[len(prefix) + 2 :])
    return IplString("", text)


@dataclasses.dataclass(frozen=True, slots=True)
class SbatLevel:
    """A revocation level of SBAT (shim's ``SbatLevel`` variable).

    Attributes:
        datestamp: the header's datestamp (``2023012900``), an integer.
        components: (component name, lowest generation allowed) pairs,
            in the text's order.
    """

    datestamp: int
    components: tuple[tuple[str, int], ...]

    @classmethod
    def from_text(cls, text: str, where: str) -> SbatLevel:
        """Parse ``sbat,1,<datestamp>`` then ``<component>,<generation>``
        lines (blank lines and a trailing NUL ignored).

        Raises:
            MalformedError: naming ``where`` and the line.
        """

        def bad(line: int, detail: str) -> MalformedError:
            return MalformedError("SbatLevel", f"{where}: line {line}: {detail}")

        lines = [ln.strip() for ln in text.rstrip("\0").splitlines()]
        lines = [ln for ln in lines if ln]
        if not lines:
            raise bad(1, "empty: no sbat,<version>,<datestamp> header")
        if len(lines) > _MAX_SBAT_LINES:
            raise bad(_MAX_SBAT_LINES + 1, f"over {_MAX_SBAT_LINES} lines")
        header = lines[0].split(",")
        if len(header) != 3 or header[0] != "sbat" or not header[2].isdigit():
            raise bad(1, f"{lines[0][:80]!r} is not sbat,<version>,<datestamp>")
        components: dict[str, int] = {}
        for number, line in enumerate(lines[1:], start=2):
            fields = line.split(",")
            if len(fields) < 2 or not fields[0] or not fields[1].isdigit():
                raise bad(number, f"{line[:80]!r} is not <component>,<generation>")
            if len(fields[1]) > 9 or fields[0] in components:
                raise bad(number, f"{line[:80]!r}: bad or repeated component")
            components[fields[0]] = int(fields[1])
        if len(header[2]) > 18:
            raise bad(1, "datestamp too long")
        return cls(int(header[2]), tuple(components.items()))

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> SbatLevel:
        """Parse the variable's bytes (ASCII CSV).

        Raises:
            MalformedError: not ASCII, or as :meth:`from_text`.
        """
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError:
            raise MalformedError("SbatLevel", f"{where}: not ASCII text") from None
        return cls.from_text(text, where)

    def shortfalls(self, minimum: SbatLevel) -> list[str]:
        """How this level falls short of ``minimum`` (empty: at least as
        recent): an older datestamp, a missing component, or a lower
        generation."""
        out: list[str] = []
        if self.datestamp < minimum.datestamp:
            out.append(f"datestamp {self.datestamp} < {minimum.datestamp}")
        mine = dict(self.components)
        for name, generation in sorted(minimum.components):
            have = mine.get(name)
            if have is None:
                out.append(f"{name} missing (want >= {generation})")
            elif have < generation:
                out.append(f"{name} generation {have} < {generation}")
        return out

    def to_text(self) -> str:
        """The CSV form (header version 1)."""
        lines = [f"sbat,1,{self.datestamp}"]
        lines += [f"{n},{g}" for n, g in self.components]
        return "\n".join(lines) + "\n"
