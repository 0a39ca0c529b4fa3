"""Build IMA measurement lists: the trial mode's kernel stand-in
(:mod:`node_agent.trial`), the tests' and the benchmarks'.

Mirrors the kernel: template data is hashed with SHA-1 for the logged
template hash; violations log a zero template hash and a zero file digest.
"""

from __future__ import annotations

import hashlib
import struct

from verifier.protocol.ima.log import IMA_PCR, ImaEntry
from verifier.protocol.ima.replay import BOOT_AGGREGATE

__all__ = [
    "boot_aggregate_entry",
    "make_entry",
    "pcr_values",
    "to_ascii",
    "to_binary",
]

_U32 = struct.Struct("<I")


def make_entry(
    path: str,
    content: bytes | None = None,
    template: str = "ima-ng",
    algorithm: str = "sha256",
    signature: bytes = b"",
    buffer: bytes | None = None,
    violation: bool = False,
    pcr: int = IMA_PCR,
    digest: bytes | None = None,
) -> ImaEntry:
    """An entry as the kernel would log it.

    Args:
        path: file path or event name.
        content: the file content (hashed with ``algorithm``), or
        digest: the file digest itself.
        template: ``ima``, ``ima-ng``, ``ima-sig`` or ``ima-buf``.
        signature: for ``ima-sig``.
        buffer: for ``ima-buf`` (its digest is the file digest).
        violation: log as a violation (zero digests).
    """
    if template == "ima":
        algorithm = "sha1"
    if buffer is not None:
        content = buffer
    if digest is None:
        digest = hashlib.new(algorithm, content or b"").digest()
    if violation:
        digest = bytes(len(digest))
    raw = path.encode("utf-8", "surrogateescape")
    if template == "ima":
        data = digest + _U32.pack(len(raw)) + raw
    else:
        fields = [algorithm.encode() + b":\x00" + digest, raw + b"\x00"]
        if template == "ima-sig":
            fields.append(signature)
        elif template == "ima-buf":
            fields.append(buffer or b"")
        data = b"".join(_U32.pack(len(f)) + f for f in fields)
    entry = ImaEntry.from_template(pcr, template, bytes(20), data)
    thash = (
        bytes(20)
        if violation
        else hashlib.sha1(entry.template_data, usedforsecurity=False).digest()
    )
    return ImaEntry.from_template(pcr, template, thash, data)


def boot_aggregate_entry(
    pcrs: list[bytes], template: str = "ima-ng", algorithm: str = "sha256"
) -> ImaEntry:
    """The first entry for the given PCR 0-9 values of the ``algorithm``
    bank, as Linux >= 5.8 computes it: over PCRs 0-7 only for sha1 (written
    apart from :mod:`verifier.protocol.ima.replay`)."""
    count = 8 if algorithm == "sha1" else 10
    digest = hashlib.new(algorithm, b"".join(pcrs[:count])).digest()
    return make_entry(
        BOOT_AGGREGATE, template=template, digest=digest, algorithm=algorithm
    )


def to_binary(entries: list[ImaEntry]) -> bytes:
    """``binary_runtime_measurements`` holding ``entries``."""
    return b"".join(e.to_binary() for e in entries)


def to_ascii(entries: list[ImaEntry]) -> str:
    """``ascii_runtime_measurements`` holding ``entries``."""
    return "".join(e.to_ascii() + "\n" for e in entries)


def pcr_values(entries: list[ImaEntry]) -> tuple[bytes, bytes]:
    """PCR 10 (SHA-1 bank, SHA-256 bank) after extending ``entries``.

    Written independently of :mod:`.replay`, as the TPM computes it.
    """
    pcr1, pcr256 = bytes(20), bytes(32)
    for e in entries:
        if e.template_hash == bytes(20):
            m1, m256 = b"\xff" * 20, b"\xff" * 32
        else:
            m1 = hashlib.sha1(e.template_data, usedforsecurity=False).digest()
            m256 = hashlib.sha256(e.template_data).digest()
        pcr1 = hashlib.sha1(pcr1 + m1, usedforsecurity=False).digest()
        pcr256 = hashlib.sha256(pcr256 + m256).digest()
    return pcr1, pcr256
