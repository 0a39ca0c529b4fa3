"""Field decoding and checks shared by the wire messages.

Two layers, so that every message validates exactly once whichever way it
is made:

* :class:`Reader` turns a decoded JSON object into Python values (base64
  and hex to bytes; types as JSON has them) and, for requests, refuses
  fields the message does not define;
* the ``check_*`` functions validate Python values and are called from the
  messages' ``__post_init__``, so a message built by a producer is held to
  the same rules as one parsed from the wire.

Every refusal is a :class:`~verifier.protocol.errors.FieldError` (code
``bad_field``) naming the field, or, for well-formed content that is not a
valid instance of what it names (a UUID, a certificate, a TPM key), a
:class:`~verifier.protocol.errors.MalformedError` (code ``malformed``) that
names the field in its detail.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
import uuid as uuid_mod
from collections.abc import Mapping
from typing import Any

from cryptography import x509

from verifier.protocol.errors import FieldError, MalformedError
from verifier.protocol.tpm import TpmPublic

__all__ = [
    "MAX_PEM",
    "MAX_TPM_PUBLIC",
    "Reader",
    "b64",
    "canonical_uuid_field",
    "check_bool",
    "check_bytes",
    "check_host",
    "check_int",
    "check_pem_certificate",
    "check_str",
    "check_tpm_public",
    "tpm_public",
]

#: The largest marshalled TPM2B_PUBLIC accepted (an RSA-4096 key is ~550).
MAX_TPM_PUBLIC = 1024
#: The largest PEM certificate accepted.
MAX_PEM = 16384
_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")


def b64(data: bytes) -> str:
    """Standard base64 text of ``data``."""
    return base64.b64encode(data).decode("ascii")


class Reader:
    """Reads the fields of one JSON object.

    Args:
        data: the decoded JSON value.
        structure: the message's name, for errors.

    Raises:
        MalformedError: ``data`` is not a JSON object.
    """

    def __init__(self, data: object, structure: str) -> None:
        if not isinstance(data, Mapping):
            raise MalformedError(structure, "must be a JSON object")
        self._data: Mapping[Any, Any] = data
        self._structure = structure
        self._seen: set[str] = set()

    def _error(self, name: str, detail: str) -> FieldError:
        return FieldError(self._structure, name, detail)

    def get(self, name: str) -> Any:
        """The raw JSON value of field ``name`` (None when absent)."""
        self._seen.add(name)
        return self._data.get(name)

    def b64(self, name: str, max_len: int) -> bytes:
        """A required base64 field, decoded.

        Raises:
            FieldError: missing, not a string, not base64, or its decoded
                form would exceed ``max_len`` bytes.
        """
        text = self.get(name)
        if not isinstance(text, str):
            raise self._error(name, "must be a base64 string")
        if len(text) > 4 * ((max_len + 2) // 3):
            raise self._error(name, f"is larger than {max_len} bytes")
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise self._error(name, "is not valid base64") from None

    def optional_b64(self, name: str, max_len: int) -> bytes | None:
        """Like :meth:`b64`, None when absent or null."""
        return None if self.get(name) is None else self.b64(name, max_len)

    def b64_list(self, name: str, max_items: int, max_len: int) -> tuple[bytes, ...]:
        """A required list of base64 strings, decoded.

        Raises:
            FieldError: not a list of at most ``max_items``, or an item as
                :meth:`b64` refuses it (named ``name.index``).
        """
        items = self.get(name)
        if not isinstance(items, list) or len(items) > max_items:
            raise self._error(name, f"must be a list of at most {max_items} items")
        inner = Reader({f"{name}.{i}": v for i, v in enumerate(items)}, self._structure)
        return tuple(inner.b64(f"{name}.{i}", max_len) for i in range(len(items)))

    def hex(self, name: str, max_len: int) -> bytes:
        """A required hex field, decoded.

        Raises:
            FieldError: missing, not a string, not hex, or longer than
                ``max_len`` bytes.
        """
        text = self.get(name)
        if not isinstance(text, str) or len(text) > 2 * max_len:
            raise self._error(name, f"must be a hex string of at most {max_len} bytes")
        try:
            return bytes.fromhex(text)
        except ValueError:
            raise self._error(name, "is not hex") from None

    def finish(self) -> None:
        """Refuse fields the message did not read (requests only, so that a
        misspelt optional field is not silently ignored).

        Raises:
            FieldError: naming the first unknown field.
        """
        unknown = sorted(str(k) for k in self._data if k not in self._seen)
        if unknown:
            raise self._error(unknown[0], "is not a field of this message")


def check_bytes(
    structure: str,
    name: str,
    value: object,
    max_len: int,
    *,
    exact: int | None = None,
    min_len: int = 0,
    optional: bool = False,
) -> None:
    """Raises: FieldError unless ``value`` is bytes of an allowed length
    (``exact``, or ``min_len..max_len``), or None when ``optional``."""
    if value is None and optional:
        return
    if not isinstance(value, bytes):
        raise FieldError(structure, name, "must be bytes")
    if exact is not None and len(value) != exact:
        raise FieldError(structure, name, f"must be {exact} bytes, not {len(value)}")
    if len(value) > max_len:
        raise FieldError(structure, name, f"is larger than {max_len} bytes")
    if len(value) < min_len:
        raise FieldError(structure, name, f"must be at least {min_len} bytes")


def check_str(
    structure: str,
    name: str,
    value: object,
    max_len: int,
    *,
    min_len: int = 1,
    optional: bool = False,
) -> None:
    """Raises: FieldError unless ``value`` is a string of min_len..max_len
    characters (or None when ``optional``)."""
    if value is None and optional:
        return
    if not isinstance(value, str) or not min_len <= len(value) <= max_len:
        raise FieldError(
            structure, name, f"must be a string of {min_len} to {max_len} characters"
        )


def check_int(structure: str, name: str, value: object, low: int, high: int) -> None:
    """Raises: FieldError unless ``value`` is an integer (not a boolean) in
    ``low..high``."""
    if type(value) is not int or not low <= value <= high:
        raise FieldError(structure, name, f"must be an integer {low}..{high}")


def check_bool(structure: str, name: str, value: object) -> None:
    """Raises: FieldError unless ``value`` is true or false."""
    if not isinstance(value, bool):
        raise FieldError(structure, name, "must be true or false")


def canonical_uuid_field(
    structure: str, name: str, value: object, *, optional: bool = False
) -> str | None:
    """The canonical (lower-case, hyphenated) form of a UUID field.

    Raises:
        FieldError: not a string.
        MalformedError: a string that is not a UUID.
    """
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > 64:
        raise FieldError(structure, name, "must be a UUID string")
    try:
        return str(uuid_mod.UUID(value))
    except ValueError:
        raise MalformedError(structure, f"'{name}': {value!r} is not a UUID") from None


def check_host(structure: str, name: str, value: object) -> None:
    """A host a client can connect to: an IP address or a DNS name.

    Raises:
        FieldError: not a string of 1..253 characters.
        MalformedError: neither an IP address nor a DNS name (e.g. holds
            spaces, slashes or ``@``, which would change a URL built on it).
    """
    check_str(structure, name, value, 253)
    assert isinstance(value, str)
    try:
        ipaddress.ip_address(value)
        return
    except ValueError:
        pass
    labels = value[:-1].split(".") if value.endswith(".") else value.split(".")
    if not all(_LABEL.match(label) for label in labels):
        raise MalformedError(
            structure, f"'{name}': {value!r} is not an IP address or a DNS name"
        )


def check_pem_certificate(structure: str, name: str, value: object) -> None:
    """Exactly one X.509 certificate in PEM (what peers pin).

    Raises:
        FieldError: not a string of at most :data:`MAX_PEM` characters.
        MalformedError: not exactly one PEM certificate.
    """
    check_str(structure, name, value, MAX_PEM)
    assert isinstance(value, str)
    try:
        certs = x509.load_pem_x509_certificates(value.encode())
    except ValueError:
        certs = []
    if len(certs) != 1:
        raise MalformedError(
            structure, f"'{name}' is not exactly one PEM X.509 certificate"
        )


def check_tpm_public(structure: str, name: str, value: object) -> None:
    """Raises: FieldError unless ``value`` is a parsed :class:`TpmPublic`."""
    if not isinstance(value, TpmPublic):
        raise FieldError(structure, name, "must be a TPM public key")


def tpm_public(structure: str, name: str, raw: bytes) -> TpmPublic:
    """Parse a marshalled TPM2B_PUBLIC field.

    Raises:
        MalformedError: naming the field and what does not parse.
    """
    try:
        return TpmPublic.from_bytes(raw)
    except MalformedError as exc:
        raise MalformedError(
            structure, f"'{name}' is not a TPM2B_PUBLIC: {exc.detail}"
        ) from None


# Nova's [DEFAULT]/host: a host name (or a label without spaces or slashes).
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


def check_host_name(structure: str, name: str, value: object) -> None:
    """Raises: FieldError unless ``value`` is 1-255 letters, digits, '.',
    '_' or '-' starting with a letter or digit (a compute host's name)."""
    if not isinstance(value, str) or not _HOST_NAME.fullmatch(value):
        raise FieldError(
            structure,
            name,
            "a compute host name is 1-255 letters, digits, '.', '_' or '-' "
            "starting with a letter or digit",
        )
