"""C2SP tlog-checkpoint bodies inside C2SP signed-notes (Ed25519, type 0x01).

A checkpoint body is three lines, each ending in ``\\n``: the log's origin,
its tree size in decimal and the base64 of its RFC 9162 root hash;
extension lines may follow (this log writes none; they are ignored when
read, as they are covered by the signature but not understood here).

A signed note is the body, an empty line, and one or more signature lines
``— <name> <base64(key hash || signature)>\\n`` (U+2014 EM DASH and a space).
The key hash is ``SHA-256(name || "\\n" || 0x01 || raw public key)[:4]``;
the Ed25519 signature covers the body bytes. A name is non-empty UTF-8
without spaces or ``+``. A reader looks for the line of the signer it
trusts (name and key hash), ignores the others, and refuses the note if
that line does not verify. Limits, as in the reference implementation: at
most 100 signature lines, no control characters but ``\\n``.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import re

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from verifier.protocol.errors import MalformedError
from verifier.protocol.translog.tree import HASH_SIZE, MAX_SIZE, LogProofError

__all__ = [
    "MAX_NOTE_BYTES",
    "MAX_SIGNATURES",
    "ORIGIN_PREFIX",
    "Checkpoint",
    "key_hash",
    "log_origin",
    "open_checkpoint",
    "sign_checkpoint",
    "verifier_key",
]

#: The default origin (and signer name) prefix of this deployment's log.
ORIGIN_PREFIX = "trusted-cloud.attestation/"
#: Most signature lines a note may carry.
MAX_SIGNATURES = 100
#: Largest note accepted (ours are under 300 bytes).
MAX_NOTE_BYTES = 64 * 1024
_ED25519 = b"\x01"
_DASH = "\u2014 "
_SIZE = re.compile(r"0|[1-9][0-9]{0,18}")
# Control characters other than "\n" (C0, DEL, C1) and Unicode spaces are
# refused in a note; spaces only where the format puts them.
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def _raw(public_key: ed25519.Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )


def _valid_name(name: object) -> bool:
    return (
        isinstance(name, str)
        and name != ""
        and "+" not in name
        and not any(c.isspace() for c in name)
        and not _CONTROL.search(name)
    )


def key_hash(name: str, public_key: ed25519.Ed25519PublicKey) -> bytes:
    """The 4-byte key hash of a signer: ``SHA-256(name || "\\n" || 0x01 ||
    public key)[:4]``.

    Raises:
        MalformedError: ``name`` is not a valid signer name.
    """
    if not _valid_name(name):
        raise MalformedError("signed note", "a signer name is non-empty, no space or +")
    if not isinstance(public_key, ed25519.Ed25519PublicKey):
        raise MalformedError("signed note", "the key must be an Ed25519 public key")
    return hashlib.sha256(name.encode() + b"\n" + _ED25519 + _raw(public_key)).digest()[
        :4
    ]


def verifier_key(name: str, public_key: ed25519.Ed25519PublicKey) -> str:
    """The signer's verifier key text, ``<name>+<hex key hash>+<base64(0x01
    || public key)>`` (the form note tools exchange).

    Raises:
        MalformedError: ``name`` is not a valid signer name.
    """
    raw = base64.b64encode(_ED25519 + _raw(public_key)).decode()
    return f"{name}+{key_hash(name, public_key).hex()}+{raw}"


def log_origin(public_key: ed25519.Ed25519PublicKey) -> str:
    """This deployment's log origin and signer name for the verifier's event
    key: :data:`ORIGIN_PREFIX` and the first 16 hex digits of SHA-256 of the
    raw public key.

    Raises:
        MalformedError: ``public_key`` is not an Ed25519 public key.
    """
    if not isinstance(public_key, ed25519.Ed25519PublicKey):
        raise MalformedError("log origin", "the key must be an Ed25519 public key")
    return ORIGIN_PREFIX + hashlib.sha256(_raw(public_key)).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A log's signed statement of its tree: ``origin``, ``size``, ``root``.

    Raises:
        MalformedError: an empty origin or one with control characters, a
            size out of 0..2**63-1, a root that is not 32 bytes.
    """

    origin: str
    size: int
    root: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.origin, str) or not self.origin.strip():
            raise MalformedError("checkpoint", "origin must be a non-empty string")
        if _CONTROL.search(self.origin) or "\n" in self.origin:
            raise MalformedError("checkpoint", "origin has a control character")
        if type(self.size) is not int or not 0 <= self.size <= MAX_SIZE:
            raise MalformedError("checkpoint", f"size must be 0..{MAX_SIZE}")
        if not isinstance(self.root, bytes) or len(self.root) != HASH_SIZE:
            raise MalformedError("checkpoint", "root must be 32 bytes")

    def body(self) -> bytes:
        """The note text: ``origin\\nsize\\nbase64(root)\\n`` in UTF-8."""
        root = base64.b64encode(self.root).decode()
        return f"{self.origin}\n{self.size}\n{root}\n".encode()

    @classmethod
    def from_body(cls, text: str) -> Checkpoint:
        """Parse a checkpoint body (extension lines are ignored).

        Raises:
            MalformedError: not a checkpoint body.
        """
        if not text.endswith("\n"):
            raise MalformedError("checkpoint", "the body must end with a newline")
        lines = text[:-1].split("\n")
        if len(lines) < 3 or "" in lines:
            raise MalformedError("checkpoint", "needs origin, size and root lines")
        origin, size, root = lines[:3]
        if not _SIZE.fullmatch(size):
            raise MalformedError("checkpoint", "size must be a decimal integer")
        try:
            digest = base64.b64decode(root.encode("ascii"), validate=True)
        except (binascii.Error, ValueError):
            raise MalformedError("checkpoint", "root is not base64") from None
        if base64.b64encode(digest).decode() != root:
            raise MalformedError("checkpoint", "root is not canonical base64")
        return cls(origin, int(size), digest)


def sign_checkpoint(cp: Checkpoint, key: ed25519.Ed25519PrivateKey, name: str) -> str:
    """The signed note of ``cp``: its body, an empty line and one signature
    line by ``name``.

    Raises:
        MalformedError: ``name`` is not a valid signer name.
    """
    khash = key_hash(name, key.public_key())
    body = cp.body()
    signature = base64.b64encode(khash + key.sign(body)).decode()
    return f"{body.decode()}\n{_DASH}{name} {signature}\n"


def _split_note(note: str | bytes) -> tuple[str, list[tuple[str, bytes]]]:
    """The text and the ``(name, key hash || signature)`` of each line."""
    if isinstance(note, bytes):
        if len(note) > MAX_NOTE_BYTES:
            raise MalformedError("signed note", f"over {MAX_NOTE_BYTES} bytes")
        try:
            note = note.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedError("signed note", "not UTF-8") from None
    if not isinstance(note, str):
        raise MalformedError("signed note", "must be text")
    if len(note) > MAX_NOTE_BYTES:
        raise MalformedError("signed note", f"over {MAX_NOTE_BYTES} characters")
    if _CONTROL.search(note) or any(0xD800 <= ord(c) <= 0xDFFF for c in note):
        raise MalformedError("signed note", "has a control character")
    cut = note.rfind("\n\n")
    if cut < 0 or not note.endswith("\n"):
        raise MalformedError("signed note", "no signature block")
    text, block = note[: cut + 1], note[cut + 2 : -1].split("\n")
    if len(block) > MAX_SIGNATURES:
        raise MalformedError("signed note", f"over {MAX_SIGNATURES} signatures")
    lines = []
    for line in block:
        name, _, sig = line.removeprefix(_DASH).partition(" ")
        if not line.startswith(_DASH) or not _valid_name(name):
            raise MalformedError("signed note", "a bad signature line")
        try:
            raw = base64.b64decode(sig.encode("ascii"), validate=True)
        except (binascii.Error, ValueError):
            raise MalformedError("signed note", "a signature is not base64") from None
        if len(raw) < 5:
            raise MalformedError("signed note", "a signature is too short")
        lines.append((name, raw))
    return text, lines


def open_checkpoint(
    note: str | bytes,
    public_key: ed25519.Ed25519PublicKey,
    name: str,
    origin: str | None = None,
) -> Checkpoint:
    """Verify a signed checkpoint note and return its checkpoint.

    Args:
        note: the note text (bytes must be UTF-8).
        public_key: the signer's Ed25519 key.
        name: the signer's name (for this log, :func:`log_origin`).
        origin: the origin the checkpoint must name (None: any).

    Returns:
        The checkpoint the signer signed.

    Raises:
        MalformedError: the note or its body does not parse.
        LogProofError: ``unknown_key`` (no line by ``name`` with this key's
            hash), ``bad_signature`` (that line does not verify),
            ``wrong_origin``.
    """
    expected = key_hash(name, public_key)
    text, lines = _split_note(note)
    for signer, raw in lines:
        if signer == name and raw[:4] == expected:
            try:
                public_key.verify(raw[4:], text.encode())
            except InvalidSignature:
                raise LogProofError(
                    "bad_signature", f"the signature of {name} does not verify"
                ) from None
            break
    else:
        raise LogProofError("unknown_key", f"the note has no signature of {name}")
    cp = Checkpoint.from_body(text)
    if origin is not None and cp.origin != origin:
        raise LogProofError(
            "wrong_origin", f"checkpoint of {cp.origin[:100]!r}, not {origin!r}"
        )
    return cp
