"""The key service's bodies (Snapdragon capabilities, Ensemble LKH groups,
Plutus filegroups; see :mod:`verifier.keyservice`). The LKH welcome is
:class:`verifier.protocol.lkh.Welcome`, a revocation the
:class:`verifier.protocol.events.SignedEvent`.

``PUT /v1/secrets/{name}``             :class:`SecretUpload`
``GET /v1/secrets/{name}``             -> :class:`SecretRelease`
``GET /v1/groups/{gid}/rekey?since=N`` -> :class:`RekeyLog`
``GET /v1/filegroups/{fg}/state``      -> :class:`FilegroupState`
"""

from __future__ import annotations

import dataclasses
from typing import Any

from verifier.protocol.errors import FieldError
from verifier.protocol.messages._fields import (
    Reader,
    b64,
    check_bytes,
    check_int,
    check_str,
)
from verifier.protocol.regression import STATE_BYTES, ReaderState

__all__ = [
    "MAX_SECRET",
    "FilegroupState",
    "RekeyLog",
    "SecretRelease",
    "SecretUpload",
]

#: The largest secret the key service keeps (e.g. a LUKS volume key).
MAX_SECRET = 4096
#: The most rekey messages one answer carries (the service keeps 1024).
_MAX_MESSAGES = 4096
#: The largest rekey message (entries grow with d * log_d(n)).
_MAX_MESSAGE = 1 << 20
_MAX_U64 = (1 << 64) - 1
_MAX_NAME = 128


def _check_secret(structure: str, secret: object) -> None:
    check_bytes(structure, "secret", secret, MAX_SECRET, min_len=1)


@dataclasses.dataclass(frozen=True)
class SecretUpload:
    """A tenant stores a secret (1 to :data:`MAX_SECRET` bytes).

    Raises:
        FieldError: empty, too large or not base64.
    """

    secret: bytes

    _NAME = "secret upload"

    def __post_init__(self) -> None:
        _check_secret(self._NAME, self.secret)

    def to_dict(self) -> dict[str, Any]:
        return {"secret": b64(self.secret)}

    @classmethod
    def from_dict(cls, data: object) -> SecretUpload:
        """Parse a request body (unknown fields are refused).

        Raises:
            MalformedError: naming the field.
        """
        r = Reader(data, cls._NAME)
        msg = cls(r.b64("secret", MAX_SECRET))
        r.finish()
        return msg


@dataclasses.dataclass(frozen=True)
class SecretRelease:
    """A secret released to a node holding a read capability.

    Raises:
        FieldError: empty, too large or not base64.
    """

    secret: bytes

    _NAME = "secret release"

    def __post_init__(self) -> None:
        _check_secret(self._NAME, self.secret)

    def to_dict(self) -> dict[str, Any]:
        return {"secret": b64(self.secret)}

    @classmethod
    def from_dict(cls, data: object) -> SecretRelease:
        """Parse the key service's answer (unknown fields are ignored).

        Raises:
            MalformedError: naming the field.
        """
        return cls(Reader(data, cls._NAME).b64("secret", MAX_SECRET))


@dataclasses.dataclass(frozen=True)
class RekeyLog:
    """A group's current epoch and the signed rekey messages after the
    epoch asked for (each decoded and verified by the member:
    :class:`verifier.protocol.lkh.RekeyMessage`).

    Raises:
        FieldError: a bad epoch, or messages that are not a bounded list of
            base64 strings.
    """

    epoch: int
    messages: tuple[bytes, ...]

    _NAME = "rekey log"

    def __post_init__(self) -> None:
        check_int(self._NAME, "epoch", self.epoch, 0, _MAX_U64)
        if not isinstance(self.messages, tuple) or len(self.messages) > _MAX_MESSAGES:
            raise FieldError(
                self._NAME, "messages", f"must be at most {_MAX_MESSAGES} messages"
            )
        for i, message in enumerate(self.messages):
            check_bytes(self._NAME, f"messages.{i}", message, _MAX_MESSAGE)

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "messages": [b64(m) for m in self.messages]}

    @classmethod
    def from_dict(cls, data: object) -> RekeyLog:
        """Parse the key service's answer (unknown fields are ignored).

        Raises:
            MalformedError: naming the field.
        """
        r = Reader(data, cls._NAME)
        messages = r.b64_list("messages", _MAX_MESSAGES, _MAX_MESSAGE)
        return cls(r.get("epoch"), messages)


@dataclasses.dataclass(frozen=True)
class FilegroupState:
    """A filegroup's key-regression state for a reader (Plutus).

    Attributes:
        group: the filegroup.
        version: the newest key version the state opens.
        state: the secret state (32 bytes).
        check: the published check value, ``H(state(0))`` (32 bytes).

    Raises:
        FieldError: a field of the wrong type or size.
    """

    group: str
    version: int
    state: bytes
    check: bytes

    _NAME = "filegroup state"

    def __post_init__(self) -> None:
        check_str(self._NAME, "group", self.group, _MAX_NAME)
        check_int(self._NAME, "version", self.version, 0, _MAX_U64)
        check_bytes(self._NAME, "state", self.state, STATE_BYTES, exact=STATE_BYTES)
        check_bytes(self._NAME, "check", self.check, STATE_BYTES, exact=STATE_BYTES)

    @classmethod
    def of(cls, reader: ReaderState) -> FilegroupState:
        """The message for a reader's state."""
        return cls(reader.group, reader.version, reader.state, reader.check)

    def reader_state(self) -> ReaderState:
        """The state for :class:`~verifier.protocol.regression.ReaderState`
        users."""
        return ReaderState(self.group, self.version, self.state, self.check)

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "version": self.version,
            "state": b64(self.state),
            "check": b64(self.check),
        }

    @classmethod
    def from_dict(cls, data: object) -> FilegroupState:
        """Parse the key service's answer (unknown fields are ignored).

        Raises:
            MalformedError: naming the field.
        """
        r = Reader(data, cls._NAME)
        return cls(
            r.get("group"),
            r.get("version"),
            r.b64("state", STATE_BYTES),
            r.b64("check", STATE_BYTES),
        )
