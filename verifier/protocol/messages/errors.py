"""The error body every one of our HTTP services answers a refusal with
(4xx) or an unexpected failure (500)::

    {"error": {"code": "bad_field", "message": "'port' must be ..."}}

``code`` is stable and machine-readable, ``message`` names the problem for
a human and never holds key material.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from verifier.protocol.errors import FieldError
from verifier.protocol.messages._fields import Reader, check_str

__all__ = ["MAX_ERROR_MESSAGE", "ErrorBody"]

_MAX_CODE = 128
#: The longest message an error body carries.
MAX_ERROR_MESSAGE = 65536


@dataclasses.dataclass(frozen=True)
class ErrorBody:
    """A refusal or failure.

    Raises:
        FieldError: ``code`` or ``message`` is not a bounded string (an
            empty message is allowed).
    """

    code: str
    message: str

    _NAME = "error body"

    def __post_init__(self) -> None:
        check_str(self._NAME, "error.code", self.code, _MAX_CODE)
        check_str(
            self._NAME, "error.message", self.message, MAX_ERROR_MESSAGE, min_len=0
        )

    def to_dict(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}

    @classmethod
    def from_dict(cls, data: object) -> ErrorBody:
        """Parse an error answer (unknown fields are ignored).

        Raises:
            MalformedError: not an error body, naming the field.
        """
        error = Reader(data, cls._NAME).get("error")
        if not isinstance(error, dict):
            raise FieldError(cls._NAME, "error", "must be an object")
        r = Reader(error, cls._NAME)
        return cls(r.get("code"), r.get("message"))
