"""Policy-sealed data (Excalibur, CP-ABE): the verifier publishes its
public parameters and key epoch, posts each attested node its key sealed
to NK, and tenants hand nodes sealed blobs.

``GET /v1/abe/params`` (verifier)  -> :class:`AbeParams`
``POST /v1/keys/abe`` (agent)      :class:`AbeKeyDelivery`
``POST /v1/sealed`` (agent)        :class:`SealedBlobRequest`
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from verifier.protocol.errors import FieldError, MalformedError
from verifier.protocol.messages._fields import Reader, b64, check_bytes, check_int

if TYPE_CHECKING:  # CP-ABE (pymcl) is the ``abe`` extra: loaded only for params
    from verifier.protocol.abe import PublicParams

__all__ = [
    "MAX_KEY_ENVELOPE",
    "MAX_PARAMS",
    "MAX_SEALED_BLOB",
    "AbeKeyDelivery",
    "AbeParams",
    "SealedBlobRequest",
]

#: The largest sealed CP-ABE key (a key grows with its attributes).
MAX_KEY_ENVELOPE = 1 << 20
#: The largest encoded public parameters.
MAX_PARAMS = 4096
#: The largest policy-sealed blob.
MAX_SEALED_BLOB = 16 << 20
_MAX_EPOCH = (1 << 63) - 1
_MAX_PROJECT = 255


@dataclasses.dataclass(frozen=True)
class AbeParams:
    """The verifier's CP-ABE public parameters and current key epoch.

    On the wire the parameters' id (hex SHA-256 of their encoding) comes
    along; an id that is not theirs is refused. ``project`` is the
    caller's project as the verifier labels its nodes: every node's key
    carries ``project=<its project>``, so a tenant seals to
    ``... and project=<project>`` and no other project's node opens it
    ("" when the caller owns nothing; the tenant tool then refuses to seal).

    Raises:
        FieldError: a bad epoch or parameters object.
        MalformedError: parameters that do not decode, or a wrong id.
    """

    params: PublicParams
    epoch: int
    project: str = ""

    _NAME = "ABE parameters"

    def __post_init__(self) -> None:
        from verifier.protocol.abe import PublicParams

        if not isinstance(self.params, PublicParams):
            raise FieldError(self._NAME, "params", "must be CP-ABE public parameters")
        check_int(self._NAME, "epoch", self.epoch, 0, _MAX_EPOCH)
        if not isinstance(self.project, str) or len(self.project) > _MAX_PROJECT:
            raise FieldError(
                self._NAME, "project", f"must be a string of <= {_MAX_PROJECT} chars"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": b64(self.params.to_bytes()),
            "id": self.params.id.hex(),
            "epoch": self.epoch,
            "project": self.project,
        }

    @classmethod
    def from_dict(cls, data: object) -> AbeParams:
        """Parse the verifier's answer (unknown fields are ignored).

        Raises:
            MalformedError: naming the field.
        """
        from verifier.protocol.abe import PublicParams

        r = Reader(data, cls._NAME)
        pp = PublicParams.from_bytes(r.b64("params", MAX_PARAMS))
        if r.get("id") != pp.id.hex():
            raise MalformedError(cls._NAME, "'id' is not the id of 'params'")
        project = r.get("project")
        return cls(pp, r.get("epoch"), "" if project is None else project)


@dataclasses.dataclass(frozen=True)
class AbeKeyDelivery:
    """A CP-ABE key for a node, sealed to its NK (kind ``ABE``).

    Attributes:
        key: the sealed key envelope (the agent opens and decodes it).
        params: the encoded public parameters it belongs to (the agent
            decodes them and checks the key is theirs).
        epoch: the key epoch.

    Raises:
        FieldError: a field of the wrong type or size.
    """

    key: bytes
    params: bytes
    epoch: int

    _NAME = "ABE key delivery"

    def __post_init__(self) -> None:
        check_bytes(self._NAME, "key", self.key, MAX_KEY_ENVELOPE, min_len=1)
        check_bytes(self._NAME, "params", self.params, MAX_PARAMS, min_len=1)
        check_int(self._NAME, "epoch", self.epoch, 0, _MAX_EPOCH)

    def to_dict(self) -> dict[str, Any]:
        return {"key": b64(self.key), "params": b64(self.params), "epoch": self.epoch}

    @classmethod
    def from_dict(cls, data: object) -> AbeKeyDelivery:
        """Parse a request body (unknown fields are refused).

        Raises:
            MalformedError: naming the field.
        """
        r = Reader(data, cls._NAME)
        msg = cls(
            r.b64("key", MAX_KEY_ENVELOPE),
            r.b64("params", MAX_PARAMS),
            r.get("epoch"),
        )
        r.finish()
        return msg


@dataclasses.dataclass(frozen=True)
class SealedBlobRequest:
    """A policy-sealed blob for a node to open (it decodes it).

    Raises:
        FieldError: not bytes, or larger than :data:`MAX_SEALED_BLOB`.
    """

    blob: bytes

    _NAME = "sealed blob request"

    def __post_init__(self) -> None:
        check_bytes(self._NAME, "blob", self.blob, MAX_SEALED_BLOB)

    def to_dict(self) -> dict[str, Any]:
        return {"blob": b64(self.blob)}

    @classmethod
    def from_dict(cls, data: object) -> SealedBlobRequest:
        """Parse a request body (unknown fields are refused).

        Raises:
            MalformedError: naming the field.
        """
        r = Reader(data, cls._NAME)
        msg = cls(r.b64("blob", MAX_SEALED_BLOB))
        r.finish()
        return msg
