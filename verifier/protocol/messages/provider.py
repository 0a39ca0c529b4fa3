"""Provider EK registration: the vTPM manager on a compute host registers
the EK of each instance's vTPM under the instance UUID, so that only that
vTPM can later register as the node (ARCHITECTURE "Parties": registrar).

``PUT /v1/agents/{uuid}/ek``  :class:`ProviderEkRegistration` ->
                              :class:`ProviderEkResult` (201 new, 200 known)
``GET /v1/agents/{uuid}/ek``  -> :class:`ProviderEkRecord`

A vTPM that Nova's libvirt driver made is bound to its compute host
instead: the provider enrols each host's swtpm local CA
(:class:`HostCaEnrolment`) and records where Nova placed each instance
(:class:`InstancePlacement`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from verifier.protocol.ekcert import MAX_HOST_CA_PEM
from verifier.protocol.errors import FieldError, MalformedError
from verifier.protocol.messages._fields import (
    MAX_TPM_PUBLIC,
    Reader,
    b64,
    canonical_uuid_field,
    check_bool,
    check_bytes,
    check_host_name,
    check_str,
    check_tpm_public,
    tpm_public,
)
from verifier.protocol.messages.registration import MAX_EK_CERTIFICATE
from verifier.protocol.tpm import TpmPublic

__all__ = [
    "HostCaEnrolment",
    "check_host_name",
    "InstancePlacement",
    "ProviderEkRecord",
    "ProviderEkRegistration",
    "ProviderEkResult",
]

_MAX_PROVIDER = 255


def _check_ek(structure: str, ek_public: object, ek_certificate: object) -> None:
    check_tpm_public(structure, "ek_public", ek_public)
    check_bytes(
        structure, "ek_certificate", ek_certificate, MAX_EK_CERTIFICATE, optional=True
    )


def _ek_dict(ek_public: TpmPublic, ek_certificate: bytes | None) -> dict[str, Any]:
    return {
        "ek_public": b64(ek_public.to_bytes()),
        "ek_certificate": b64(ek_certificate) if ek_certificate is not None else None,
    }


def _read_ek(r: Reader, structure: str) -> tuple[TpmPublic, bytes | None]:
    raw = r.b64("ek_public", MAX_TPM_PUBLIC)
    ek = tpm_public(structure, "ek_public", raw)
    return ek, r.optional_b64("ek_certificate", MAX_EK_CERTIFICATE)


@dataclasses.dataclass(frozen=True)
class ProviderEkRegistration:
    """A vTPM's EK as its provider created it (the UUID is in the path).

    Attributes:
        ek_public: the vTPM's endorsement key.
        ek_certificate: its DER EK certificate (signed by the host's swtpm
            local CA), or None.

    Raises:
        FieldError: a field of the wrong type or size.
        MalformedError: ``ek_public`` is not a TPM2B_PUBLIC.
    """

    ek_public: TpmPublic
    ek_certificate: bytes | None = None

    _NAME = "provider EK registration"

    def __post_init__(self) -> None:
        _check_ek(self._NAME, self.ek_public, self.ek_certificate)

    def to_dict(self) -> dict[str, Any]:
        return _ek_dict(self.ek_public, self.ek_certificate)

    @classmethod
    def from_dict(cls, data: object) -> ProviderEkRegistration:
        """Parse a request body (unknown fields are refused).

        Raises:
            MalformedError: as the constructor, or a field that is not base64.
        """
        r = Reader(data, cls._NAME)
        msg = cls(*_read_ek(r, cls._NAME))
        r.finish()
        return msg


@dataclasses.dataclass(frozen=True)
class ProviderEkRecord:
    """The registrar's record of a provider-registered vTPM EK.

    Attributes:
        uuid: the instance (canonical form).
        provider: who registered it (its client certificate's name).

    Raises:
        FieldError, MalformedError: as :class:`ProviderEkRegistration`,
            and for ``uuid`` and ``provider``.
    """

    uuid: str
    ek_public: TpmPublic
    ek_certificate: bytes | None
    provider: str

    _NAME = "provider EK record"

    def __post_init__(self) -> None:
        canonical = canonical_uuid_field(self._NAME, "uuid", self.uuid)
        object.__setattr__(self, "uuid", canonical)
        _check_ek(self._NAME, self.ek_public, self.ek_certificate)
        check_str(self._NAME, "provider", self.provider, _MAX_PROVIDER)

    def check_node(self, uuid: str) -> None:
        """Refuse a record of another instance than the one asked for.

        Raises:
            MalformedError: ``uuid`` is not a UUID or not this record's.
        """
        wanted = canonical_uuid_field(self._NAME, "uuid", uuid)
        if wanted != self.uuid:
            raise MalformedError(
                self._NAME, f"'uuid' is {self.uuid}, the instance asked for is {wanted}"
            )

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"uuid": self.uuid}
        body.update(_ek_dict(self.ek_public, self.ek_certificate))
        body["provider"] = self.provider
        return body

    @classmethod
    def from_dict(cls, data: object) -> ProviderEkRecord:
        """Parse the registrar's answer (unknown fields are ignored).

        Raises:
            MalformedError: as the constructor, or a field that is not base64.
        """
        r = Reader(data, cls._NAME)
        uuid = r.get("uuid")
        ek, cert = _read_ek(r, cls._NAME)
        return cls(uuid, ek, cert, r.get("provider"))


@dataclasses.dataclass(frozen=True)
class ProviderEkResult:
    """The registrar recorded the EK (``"registered": true`` on the wire):
    ``created`` if it was new.

    Raises:
        FieldError: ``created`` is not a boolean; MalformedError: a bad UUID.
    """

    uuid: str
    created: bool

    _NAME = "provider EK result"

    def __post_init__(self) -> None:
        canonical = canonical_uuid_field(self._NAME, "uuid", self.uuid)
        object.__setattr__(self, "uuid", canonical)
        check_bool(self._NAME, "created", self.created)

    def to_dict(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "registered": True, "created": self.created}

    @classmethod
    def from_dict(cls, data: object) -> ProviderEkResult:
        """Parse the registrar's answer (unknown fields are ignored).

        Raises:
            MalformedError: naming the field, also when ``registered`` is
                not true.
        """
        r = Reader(data, cls._NAME)
        if r.get("registered") is not True:
            raise FieldError(cls._NAME, "registered", "must be true")
        return cls(r.get("uuid"), r.get("created"))


@dataclasses.dataclass(frozen=True)
class HostCaEnrolment:
    """A compute host's swtpm local CA (PEM; the host is in the path).

    ``PUT /v1/provider/hosts/{host}`` (201 new, 200 replaced),
    ``GET`` answers it with ``host`` and ``provider`` added.

    Raises:
        FieldError: ``ca_certificate`` is not a string of 1..32 KiB.
    """

    ca_certificate: str

    _NAME = "host CA enrolment"

    def __post_init__(self) -> None:
        check_str(self._NAME, "ca_certificate", self.ca_certificate, MAX_HOST_CA_PEM)

    def to_dict(self) -> dict[str, Any]:
        return {"ca_certificate": self.ca_certificate}

    @classmethod
    def from_dict(cls, data: object) -> HostCaEnrolment:
        """Parse a request body (unknown fields are refused).

        Raises:
            MalformedError: as the constructor.
        """
        r = Reader(data, cls._NAME)
        msg = cls(r.get("ca_certificate"))
        r.finish()
        return msg


@dataclasses.dataclass(frozen=True)
class InstancePlacement:
    """The compute host Nova placed an instance on (UUID in the path).

    ``PUT /v1/provider/instances/{uuid}`` (201 new, 200 updated).

    Raises:
        FieldError: ``host`` is not a string of 1..255 characters.
    """

    host: str

    _NAME = "instance placement"

    def __post_init__(self) -> None:
        check_host_name(self._NAME, "host", self.host)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host}

    @classmethod
    def from_dict(cls, data: object) -> InstancePlacement:
        """Parse a request body (unknown fields are refused).

        Raises:
            MalformedError: as the constructor.
        """
        r = Reader(data, cls._NAME)
        msg = cls(r.get("host"))
        r.finish()
        return msg
