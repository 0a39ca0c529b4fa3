"""Stored-policy uploads: a tenant stores a runtime (IMA) or measured-boot
policy at the verifier once and names it in enrolments.

``POST /v1/policies/{kind}``  :class:`PolicyUpload`

The document itself is judged by the verifier's policy store for the
``kind`` in the path (:class:`verifier.protocol.ima.RuntimePolicy`,
:class:`verifier.protocol.mb.MeasuredBootPolicy`); this message checks the
envelope around it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from verifier.protocol.errors import FieldError
from verifier.protocol.messages._fields import Reader, b64, check_bytes, check_str

__all__ = ["MAX_POLICY_SIGNATURE", "PolicyUpload"]

#: The largest detached policy signature.
MAX_POLICY_SIGNATURE = 1024
_MAX_NAME = 255


@dataclasses.dataclass(frozen=True)
class PolicyUpload:
    """A policy document with an optional name and detached signature.

    Attributes:
        policy: the policy document (a JSON object).
        name: the name to store it under (runtime policies carry their
            own; it must then agree), or None.
        signature: a signature over the canonical document, or None.

    Raises:
        FieldError: a field of the wrong type or size.
    """

    policy: Mapping[str, Any]
    name: str | None = None
    signature: bytes | None = None

    _NAME = "policy upload"

    def __post_init__(self) -> None:
        if not isinstance(self.policy, Mapping):
            raise FieldError(self._NAME, "policy", "must be a JSON object")
        check_str(self._NAME, "name", self.name, _MAX_NAME, optional=True)
        check_bytes(
            self._NAME,
            "signature",
            self.signature,
            MAX_POLICY_SIGNATURE,
            min_len=1,
            optional=True,
        )

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"policy": dict(self.policy)}
        if self.name is not None:
            body["name"] = self.name
        if self.signature is not None:
            body["signature"] = b64(self.signature)
        return body

    @classmethod
    def from_dict(cls, data: object) -> PolicyUpload:
        """Parse a request body (unknown fields are refused).

        Raises:
            MalformedError: naming the field.
        """
        r = Reader(data, cls._NAME)
        msg = cls(
            r.get("policy"),
            r.get("name"),
            r.optional_b64("signature", MAX_POLICY_SIGNATURE),
        )
        r.finish()
        return msg
