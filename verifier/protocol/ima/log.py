"""The Linux IMA runtime measurement list.

Parses both forms the kernel exports under ``/sys/kernel/security/ima/``:

* ``binary_runtime_measurements``: per entry, a little-endian u32 PCR index,
  the 20-byte SHA-1 template hash, a u32 template-name length and the name,
  then (except for the legacy ``ima`` template) a u32 template-data length
  and the template data;
* ``ascii_runtime_measurements``: one line per entry,
  ``PCR template-hash template-name field...``.

Templates (``security/integrity/ima/ima_template.c``): ``ima`` (d|n),
``ima-ng`` (d-ng|n-ng), ``ima-sig`` (d-ng|n-ng|sig) and ``ima-buf``
(d-ng|n-ng|buf). Every field but those of ``ima`` is a u32 length followed
by its data; ``d-ng`` is ``"<algo>:\\0" || digest``, ``n-ng`` the path with
its terminating NUL.

:attr:`ImaEntry.template_data` is always the exact bytes the kernel hashes
into the PCR: for every template but ``ima`` that is the binary form's
template data; for ``ima`` it is the 20-byte digest followed by the name
zero-padded to 256 bytes (``ima_calc_field_array_hash_tfm``).

The ASCII form cannot represent every path unambiguously (the kernel prints
paths raw): the path of ``ima-sig``/``ima-buf`` entries is everything
between the digest and the last space. Prefer the binary form.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

from verifier.protocol.errors import MalformedError

__all__ = [
    "DIGEST_SIZES",
    "IMA_PCR",
    "MAX_TEMPLATE_DATA",
    "TEMPLATES",
    "ImaEntry",
    "iter_binary_spans",
    "parse_ascii",
    "parse_binary",
]

IMA_PCR = 10
#: Refuse template data larger than this (ima-buf carries at most keys and
#: command lines; the kernel's own limit is far smaller in practice).
MAX_TEMPLATE_DATA = 1 << 20
_MAX_NAME = 255  # IMA_EVENT_NAME_LEN_MAX
_STRUCT = "IMA measurement list"

#: Digest sizes by the algorithm names the kernel prints (``hash_algo_name``).
DIGEST_SIZES = {
    "md5": 16,
    "sha1": 20,
    "sha224": 28,
    "sha256": 32,
    "sha384": 48,
    "sha512": 64,
    "sm3": 32,
}
#: Supported templates and their field counts.
TEMPLATES = {"ima": 2, "ima-ng": 2, "ima-sig": 3, "ima-buf": 3}

_U32 = struct.Struct("<I")
_SIZES = DIGEST_SIZES
_HEAD = struct.Struct("<I20sI")
_ZERO20 = bytes(20)


class ImaEntry(NamedTuple):
    """One measurement (an immutable record; a named tuple for speed, as a
    verifier builds hundreds of thousands of them).

    Attributes:
        pcr: the PCR the kernel extended (10 unless the IMA policy says
            otherwise).
        template_name: ``ima``, ``ima-ng``, ``ima-sig`` or ``ima-buf``.
        template_hash: the logged SHA-1 template hash (all zero for a
            violation); never trusted, see :mod:`.replay`.
        digest_algorithm: the file digest's algorithm (``sha1`` for ``ima``).
        digest: the file (or buffer) digest; all zero for a violation.
        path: the file path or event name (``boot_aggregate`` first),
            decoded as UTF-8 with ``surrogateescape``.
        signature: the ``ima-sig`` signature (``b""`` when the file has
            none), ``None`` for other templates.
        buffer: the ``ima-buf`` buffer, ``None`` for other templates.
        template_data: the bytes the kernel hashes (see the module doc).
    """

    pcr: int
    template_name: str
    template_hash: bytes
    digest_algorithm: str
    digest: bytes
    path: str
    signature: bytes | None
    buffer: bytes | None
    template_data: bytes

    @property
    def is_violation(self) -> bool:
        """Whether the kernel logged this entry as a violation."""
        return self.template_hash == _ZERO20

    @classmethod
    def from_template(
        cls, pcr: int, name: str, template_hash: bytes, data: bytes, index: int = 0
    ) -> ImaEntry:
        """Build an entry from the binary form's template data.

        For ``ima``, ``data`` is the binary form (digest, u32 length, name).

        Raises:
            MalformedError: unknown template or data that does not parse.
        """
        if name == "ima":
            return _ima_entry(pcr, template_hash, data, index)
        nfields = TEMPLATES.get(name)
        if nfields is None:
            raise MalformedError(_STRUCT, f"entry {index}: unknown template {name!r}")
        end = len(data)
        try:
            (dlen,) = _U32.unpack_from(data, 0)
            pos = 4 + dlen
            (nlen,) = _U32.unpack_from(data, pos)
            pos += 4
            name_field = data[pos : pos + nlen]
            pos += nlen
            extra = None
            if nfields == 3:
                (xlen,) = _U32.unpack_from(data, pos)
                pos += 4
                extra = data[pos : pos + xlen]
                pos += xlen
        except struct.error:
            pos = end + 1
        if pos != end:
            raise MalformedError(
                _STRUCT, f"entry {index}: template fields do not add up to its data"
            )
        dng = data[4 : 4 + dlen]
        sep = dng.find(b":\x00")
        algo = dng[:sep].decode("ascii", "replace") if sep > 0 else ""
        digest = dng[sep + 2 :]
        if sep <= 0 or _SIZES.get(algo) != len(digest):
            algo, digest = _split_dng(dng, index)
        if not name_field or name_field[-1] != 0:
            raise MalformedError(_STRUCT, f"entry {index}: name not NUL-terminated")
        path = name_field[:-1].decode("utf-8", "surrogateescape")
        sig = extra if name == "ima-sig" else None
        buf = extra if name == "ima-buf" else None
        return cls(pcr, name, template_hash, algo, digest, path, sig, buf, data)

    def to_binary(self) -> bytes:
        """This entry in the ``binary_runtime_measurements`` form."""
        name = self.template_name.encode()
        head = _HEAD.pack(self.pcr, self.template_hash, len(name)) + name
        if self.template_name == "ima":
            path = self.path.encode("utf-8", "surrogateescape")
            return head + self.digest + _U32.pack(len(path)) + path
        return head + _U32.pack(len(self.template_data)) + self.template_data

    def to_ascii(self) -> str:
        """This entry as one ``ascii_runtime_measurements`` line (no newline)."""
        head = f"{self.pcr} {self.template_hash.hex()} {self.template_name} "
        if self.template_name == "ima":
            return f"{head}{self.digest.hex()} {self.path}"
        line = f"{head}{self.digest_algorithm}:{self.digest.hex()} {self.path}"
        extra = self.signature if self.signature is not None else self.buffer
        if extra is not None:
            line += " " + extra.hex()
        return line


def _split_dng(field: bytes, index: int) -> tuple[str, bytes]:
    sep = field.find(b":\x00")
    algo = field[:sep].decode("ascii", "replace") if sep > 0 else ""
    digest = field[sep + 2 :]
    if sep > 0 and DIGEST_SIZES.get(algo) == len(digest):
        return algo, digest
    # Kernels before d-ng knew only sha1/md5 and printed no prefix.
    legacy = {20: "sha1", 16: "md5"}.get(len(field))
    if legacy is None:
        raise MalformedError(_STRUCT, f"entry {index}: bad digest field")
    return legacy, field


def _ima_data(digest: bytes, path: bytes, index: int) -> bytes:
    if len(digest) != 20:
        raise MalformedError(_STRUCT, f"entry {index}: ima digest must be 20 bytes")
    if len(path) > _MAX_NAME:
        raise MalformedError(_STRUCT, f"entry {index}: ima name longer than 255")
    return digest + path.ljust(_MAX_NAME + 1, b"\x00")


def _ima_entry(pcr: int, template_hash: bytes, data: bytes, index: int) -> ImaEntry:
    if len(data) < 24:
        raise MalformedError(_STRUCT, f"entry {index}: truncated ima template data")
    (nlen,) = _U32.unpack_from(data, 20)
    if len(data) != 24 + nlen:
        raise MalformedError(_STRUCT, f"entry {index}: bad ima name length")
    raw = data[24:]
    hashed = _ima_data(data[:20], raw, index)
    path = raw.decode("utf-8", "surrogateescape")
    return ImaEntry(
        pcr, "ima", template_hash, "sha1", data[:20], path, None, None, hashed
    )


def _walk(
    data: bytes, first_index: int, pos: int = 0
) -> Iterator[tuple[int, bytes, str, int, int]]:
    """(pcr, template hash, template name, data start, data end) per entry,
    from the entry at offset ``pos``."""
    end = len(data)
    index = first_index
    unpack_head = _HEAD.unpack_from
    unpack_u32 = _U32.unpack_from
    while pos < end:
        if pos + 28 > end:
            raise MalformedError(_STRUCT, f"entry {index}: truncated header")
        pcr, thash, nlen = unpack_head(data, pos)
        pos += 28
        if nlen > _MAX_NAME or pos + nlen > end:
            raise MalformedError(_STRUCT, f"entry {index}: truncated template name")
        name = data[pos : pos + nlen].decode("ascii", "replace")
        pos += nlen
        if name == "ima":
            if pos + 24 > end:
                raise MalformedError(_STRUCT, f"entry {index}: truncated ima entry")
            (plen,) = unpack_u32(data, pos + 20)
            dlen = 24 + plen
        else:
            if name not in TEMPLATES:
                raise MalformedError(
                    _STRUCT, f"entry {index}: unknown template {name!r}"
                )
            if pos + 4 > end:
                raise MalformedError(_STRUCT, f"entry {index}: truncated data length")
            (dlen,) = unpack_u32(data, pos)
            pos += 4
        if dlen > MAX_TEMPLATE_DATA:
            raise MalformedError(_STRUCT, f"entry {index}: template data too large")
        if pos + dlen > end:
            raise MalformedError(_STRUCT, f"entry {index}: truncated template data")
        yield pcr, thash, name, pos, pos + dlen
        pos += dlen
        index += 1


def _slow_entry(data: bytes, pos: int, index: int) -> tuple[ImaEntry, int]:
    """The entry at ``pos`` and the offset after it, by the general (and
    slower) path: the one that names what is wrong with an entry.

    Raises:
        MalformedError: naming ``index``.
    """
    pcr, thash, name, start, stop = next(_walk(data, index, pos))
    return ImaEntry.from_template(pcr, name, thash, data[start:stop], index), stop


#: Template name (as logged) -> (name, whether it has a third field), for
#: the templates whose fields are all length-prefixed.
_NG = {
    b"ima-ng": ("ima-ng", False),
    b"ima-sig": ("ima-sig", True),
    b"ima-buf": ("ima-buf", True),
}
#: Length of a d-ng field -> (its ``"<algo>:\\0"`` prefix, the algorithm,
#: the unpacker of prefix, digest and the n-ng field's length); the known
#: algorithms give distinct lengths (were two the same, the other's
#: entries would only take the general path).
_DNG = {
    len(algo) + 2 + size: (
        algo.encode("ascii") + b":\x00",
        algo,
        struct.Struct(f"<{len(algo) + 2}s{size}sI").unpack_from,
    )
    for algo, size in DIGEST_SIZES.items()
}
_II = struct.Struct("<II")
_new_entry = tuple.__new__


def _parse_binary(data: bytes, index: int) -> list[ImaEntry]:
    """:func:`parse_binary`'s loop. Well-formed ``ima-ng``, ``ima-sig`` and
    ``ima-buf`` entries are decoded here with offsets into ``data`` alone
    (no intermediate objects); any other entry (``ima``, legacy digests,
    and every malformed one) goes through :func:`_slow_entry`, so what is
    accepted and every error are those of the general path."""
    out: list[ImaEntry] = []
    append = out.append
    head, pair, u32 = _HEAD.unpack_from, _II.unpack_from, _U32.unpack_from
    ng, dngs = _NG, _DNG
    end = len(data)
    pos = 0
    while pos < end:
        entry = None
        if pos + 36 <= end:
            pcr, thash, nlen = head(data, pos)
            p = pos + 28 + nlen
            kind = ng.get(data[pos + 28 : p])
            if kind is not None and p + 8 <= end:
                dlen, glen = pair(data, p)
                start, stop = p + 4, p + 4 + dlen
                spec = dngs.get(glen)
                q = start + 4 + glen  # the n-ng field's length
                if (
                    spec is not None
                    and dlen <= MAX_TEMPLATE_DATA
                    and q + 4 <= stop <= end
                ):
                    prefix, digest, flen = spec[2](data, start + 4)
                    q += 4
                    r = q + flen  # after the path's NUL
                    extra: bytes | None = None
                    if not kind[1]:
                        fits = r == stop
                    elif r + 4 <= stop:
                        (xlen,) = u32(data, r)
                        fits = r + 4 + xlen == stop
                        extra = data[r + 4 : stop]
                    else:
                        fits = False
                    if fits and flen and data[r - 1] == 0 and prefix == spec[0]:
                        name = kind[0]
                        sig = extra if name == "ima-sig" else None
                        entry = _new_entry(
                            ImaEntry,
                            (
                                pcr,
                                name,
                                thash,
                                spec[1],
                                digest,
                                data[q : r - 1].decode("utf-8", "surrogateescape"),
                                sig,
                                extra if name == "ima-buf" else None,
                                data[start:stop],
                            ),
                        )
                        pos = stop
        if entry is None:
            entry, pos = _slow_entry(data, pos, index)
        append(entry)
        index += 1
    return out


def iter_binary_spans(data: bytes, partial: bool = False) -> Iterator[int]:
    """The end offset of each entry of a binary list, without parsing the
    template data (for readers that skip or cut a list at entry bounds).

    Args:
        data: the list, or a part starting at an entry.
        partial: stop quietly at a truncated last entry (a cut buffer)
            instead of raising.

    Raises:
        MalformedError: as :func:`parse_binary` (not for the truncation
            of the last entry when ``partial``).
    """
    walk = _walk(data, 0)
    while True:
        try:
            item = next(walk)
        except StopIteration:
            return
        except MalformedError as exc:
            if partial and "truncated" in exc.detail:
                return
            raise
        yield item[4]


def parse_binary(data: bytes, first_index: int = 0) -> list[ImaEntry]:
    """Parse ``binary_runtime_measurements`` (little-endian, canonical).

    Args:
        data: the whole list, or the entries after those already consumed.
        first_index: index of the first entry, used in error messages.

    Raises:
        MalformedError: naming the entry index of a truncated entry, an
            unknown template or malformed template data.
    """
    return _parse_binary(data, first_index)


def _ascii_entry(line: str, index: int) -> ImaEntry:
    parts = line.split(" ", 3)
    if len(parts) < 4:
        raise MalformedError(_STRUCT, f"entry {index}: truncated line")
    pcr_s, thash_s, name, rest = parts
    if name not in TEMPLATES:
        raise MalformedError(_STRUCT, f"entry {index}: unknown template {name!r}")
    if not (pcr_s.isascii() and pcr_s.isdigit() and len(pcr_s) <= 2):
        raise MalformedError(_STRUCT, f"entry {index}: bad PCR {pcr_s[:8]!r}")
    dfield, _, tail = rest.partition(" ")
    algo, colon, dhex = dfield.rpartition(":")
    if not algo.isascii():  # the kernel prints hash_algo_name[]: ASCII
        raise MalformedError(
            _STRUCT, f"entry {index}: digest algorithm {algo[:32]!r} is not ASCII"
        )
    try:
        pcr = int(pcr_s, 10)
        thash = bytes.fromhex(thash_s)
        digest = bytes.fromhex(dhex)
    except ValueError as exc:
        raise MalformedError(_STRUCT, f"entry {index}: {exc}") from None
    if len(thash) != 20 or not 0 <= pcr < 24:
        raise MalformedError(_STRUCT, f"entry {index}: bad PCR or template hash")
    extra = b""
    if name in ("ima-sig", "ima-buf"):
        path_s, space, extra_s = tail.rpartition(" ")
        if not space:
            path_s, extra_s = tail, ""
        try:
            extra = bytes.fromhex(extra_s)
        except ValueError:
            raise MalformedError(_STRUCT, f"entry {index}: bad hex field") from None
    else:
        path_s = tail
    try:
        path = path_s.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate from a JSON string
        raise MalformedError(_STRUCT, f"entry {index}: path is not UTF-8") from None
    if name == "ima":
        if colon:
            raise MalformedError(_STRUCT, f"entry {index}: ima digest with algorithm")
        data = digest + _U32.pack(len(path)) + path
        return _ima_entry(pcr, thash, data, index)
    dng = (algo.encode("ascii") + b":\x00" if colon else b"") + digest
    pack = _U32.pack
    data = pack(len(dng)) + dng + pack(len(path) + 1) + path + b"\x00"
    if name != "ima-ng":
        data += pack(len(extra)) + extra
    if not colon or _SIZES.get(algo) != len(digest):
        # legacy or bad digest field: the general path names the fault
        return ImaEntry.from_template(pcr, name, thash, data, index)
    return _new_entry(
        ImaEntry,
        (
            pcr,
            name,
            thash,
            algo,
            digest,
            path_s if path_s.isascii() else path.decode("utf-8", "surrogateescape"),
            extra if name == "ima-sig" else None,
            extra if name == "ima-buf" else None,
            data,
        ),
    )


def parse_ascii(text: str | bytes, first_index: int = 0) -> list[ImaEntry]:
    """Parse ``ascii_runtime_measurements``.

    Args:
        text: the whole list, or the lines after those already consumed
            (bytes are decoded as UTF-8 with ``surrogateescape``).
        first_index: index of the first entry, used in error messages.

    Raises:
        MalformedError: naming the entry index of a truncated or malformed
            line or an unknown template.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:
        raise MalformedError(
            _STRUCT, f"entry {first_index + len(lines) - 1}: truncated line"
        )
    return [_ascii_entry(line, first_index + i) for i, line in enumerate(lines)]
