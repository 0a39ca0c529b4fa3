"""The registration exchange between a node agent and the registrar, and
the registrar's record of a node (ARCHITECTURE "Flows" 3; keylime's
registrar protocol with TPM2_MakeCredential / TPM2_ActivateCredential).

``POST /v1/agents/{uuid}``           :class:`RegistrationRequest` ->
                                     :class:`ActivationChallenge`
``POST /v1/agents/{uuid}/activate``  :class:`ActivationProof` ->
                                     :class:`ActivationResult`
``GET /v1/agents/{uuid}``            -> :class:`RegistrationRecord`
``POST /v1/lookup/agents``           :class:`AgentLookup` ->
                                     :class:`AgentLookupResult`

The challenge and the proof have the same shape in monitor attestation
(``POST /v1/monitor/activate``), where a customer challenges the
verifier host's TPM.

Requests refuse fields they do not define; answers ignore them (a newer
server may add some).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from verifier.protocol.errors import FieldError, MalformedError
from verifier.protocol.messages._fields import (
    MAX_TPM_PUBLIC,
    Reader,
    b64,
    canonical_uuid_field,
    check_bool,
    check_bytes,
    check_host,
    check_host_name,
    check_int,
    check_pem_certificate,
    check_tpm_public,
    tpm_public,
)
from verifier.protocol.tpm import TpmPublic

__all__ = [
    "MAX_LOOKUP",
    "MAX_CREDENTIAL",
    "MAX_EK_CERTIFICATE",
    "ActivationChallenge",
    "ActivationProof",
    "ActivationResult",
    "AgentLookup",
    "AgentLookupResult",
    "RegistrationRecord",
    "RegistrationRequest",
]

#: The largest DER EK certificate accepted.
MAX_EK_CERTIFICATE = 8192
#: The largest credential (the TPM returns at most a digest's size).
MAX_CREDENTIAL = 64
#: The largest credential blob or encrypted secret (an RSA-4096 seed: 512).
_MAX_BLOB = 1024
_MAX_PORT = 65535
#: The most nodes one look-up (a batch of enrolments) names.
MAX_LOOKUP = 1000


def _check_contact(structure: str, msg: Any) -> None:
    """The fields a request and a record share: keys, certificates, address."""
    check_tpm_public(structure, "ek_public", msg.ek_public)
    check_bytes(
        structure, "ek_certificate", msg.ek_certificate, MAX_EK_CERTIFICATE,
        optional=True,
    )  # fmt: skip
    check_tpm_public(structure, "ak_public", msg.ak_public)
    check_pem_certificate(structure, "tls_cert", msg.tls_cert)
    check_host(structure, "host", msg.host)
    check_int(structure, "port", msg.port, 1, _MAX_PORT)


def _contact_dict(msg: Any) -> dict[str, Any]:
    cert = msg.ek_certificate
    return {
        "ek_public": b64(msg.ek_public.to_bytes()),
        "ek_certificate": b64(cert) if cert is not None else None,
        "ak_public": b64(msg.ak_public.to_bytes()),
        "tls_cert": msg.tls_cert,
        "host": msg.host,
        "port": msg.port,
    }


def _read_contact(r: Reader, structure: str) -> dict[str, Any]:
    return {
        "ek_public": tpm_public(
            structure, "ek_public", r.b64("ek_public", MAX_TPM_PUBLIC)
        ),
        "ek_certificate": r.optional_b64("ek_certificate", MAX_EK_CERTIFICATE),
        "ak_public": tpm_public(
            structure, "ak_public", r.b64("ak_public", MAX_TPM_PUBLIC)
        ),
        "tls_cert": r.get("tls_cert"),
        "host": r.get("host"),
        "port": r.get("port"),
    }


@dataclasses.dataclass(frozen=True)
class RegistrationRequest:
    """What a node agent registers under its UUID (the UUID is in the path).

    Attributes:
        ek_public: the endorsement key.
        ek_certificate: its DER certificate, if the TPM has one (judged by
            the registrar against its EK anchors, not parsed here: real EK
            certificates are not always strict DER).
        ak_public: the attestation key to activate.
        tls_cert: the agent's self-signed TLS certificate (PEM), which
            verifiers and tenants pin.
        host: where the agent serves (IP address or DNS name).
        port: its TCP port.

    Raises:
        FieldError: a field of the wrong type, size or range.
        MalformedError: a key that is not a TPM2B_PUBLIC, a ``tls_cert``
            that is not exactly one PEM certificate, or a ``host`` that is
            neither an IP address nor a DNS name.
    """

    ek_public: TpmPublic
    ek_certificate: bytes | None
    ak_public: TpmPublic
    tls_cert: str
    host: str
    port: int

    _NAME = "registration request"

    def __post_init__(self) -> None:
        _check_contact(self._NAME, self)

    def to_dict(self) -> dict[str, Any]:
        """The JSON body."""
        return _contact_dict(self)

    @classmethod
    def from_dict(cls, data: object) -> RegistrationRequest:
        """Parse a request body (unknown fields are refused).

        Raises:
            MalformedError: as the constructor, or a field that is not base64.
        """
        r = Reader(data, cls._NAME)
        msg = cls(**_read_contact(r, cls._NAME))
        r.finish()
        return msg


@dataclasses.dataclass(frozen=True)
class ActivationChallenge:
    """TPM2_MakeCredential's output: the registrar's challenge to a node
    (or a customer's to the verifier host in monitor attestation).

    Raises:
        FieldError: empty or larger than 1024 bytes.
    """

    credential_blob: bytes
    encrypted_secret: bytes

    _NAME = "activation challenge"

    def __post_init__(self) -> None:
        for name in ("credential_blob", "encrypted_secret"):
            check_bytes(self._NAME, name, getattr(self, name), _MAX_BLOB, min_len=1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "credential_blob": b64(self.credential_blob),
            "encrypted_secret": b64(self.encrypted_secret),
        }

    @classmethod
    def from_dict(cls, data: object) -> ActivationChallenge:
        """Raises: MalformedError naming the field (unknown ones are ignored)."""
        r = Reader(data, cls._NAME)
        return cls(
            r.b64("credential_blob", _MAX_BLOB), r.b64("encrypted_secret", _MAX_BLOB)
        )


@dataclasses.dataclass(frozen=True)
class ActivationProof:
    """TPM2_ActivateCredential's output: the credential the TPM recovered.

    Raises:
        FieldError: empty or larger than :data:`MAX_CREDENTIAL` bytes.
    """

    credential: bytes

    _NAME = "activation proof"

    def __post_init__(self) -> None:
        check_bytes(
            self._NAME, "credential", self.credential, MAX_CREDENTIAL, min_len=1
        )

    def to_dict(self) -> dict[str, Any]:
        return {"credential": b64(self.credential)}

    @classmethod
    def from_dict(cls, data: object) -> ActivationProof:
        """Raises: MalformedError naming the field (unknown ones are ignored)."""
        return cls(Reader(data, cls._NAME).b64("credential", MAX_CREDENTIAL))


@dataclasses.dataclass(frozen=True)
class ActivationResult:
    """The registrar's answer to a good activation.

    Raises:
        FieldError: ``uuid`` not a string or ``activated`` not a boolean.
        MalformedError: ``uuid`` not a UUID.
    """

    uuid: str
    activated: bool

    _NAME = "activation result"

    def __post_init__(self) -> None:
        canonical = canonical_uuid_field(self._NAME, "uuid", self.uuid)
        object.__setattr__(self, "uuid", canonical)
        check_bool(self._NAME, "activated", self.activated)

    def to_dict(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "activated": self.activated}

    @classmethod
    def from_dict(cls, data: object) -> ActivationResult:
        """Raises: MalformedError naming the field (unknown ones are ignored)."""
        r = Reader(data, cls._NAME)
        return cls(r.get("uuid"), r.get("activated"))


@dataclasses.dataclass(frozen=True)
class RegistrationRecord:
    """The registrar's record of a node: its TPM identity, whether the AK
    is activated, and how to reach (and pin) its agent.

    Attributes:
        uuid: the node (canonical form).
        activated: True once the AK answered the credential challenge;
            nothing else may be trusted before.
        (the others as in :class:`RegistrationRequest`)

    Raises:
        FieldError, MalformedError: as :class:`RegistrationRequest`, and
            for ``uuid`` and ``activated``.
    """

    uuid: str
    ek_public: TpmPublic
    ek_certificate: bytes | None
    ak_public: TpmPublic
    tls_cert: str
    host: str
    port: int
    activated: bool

    _NAME = "registration record"

    def __post_init__(self) -> None:
        canonical = canonical_uuid_field(self._NAME, "uuid", self.uuid)
        object.__setattr__(self, "uuid", canonical)
        _check_contact(self._NAME, self)
        check_bool(self._NAME, "activated", self.activated)

    def check_node(self, uuid: str) -> None:
        """Refuse a record of another node than the one asked for.

        Raises:
            MalformedError: ``uuid`` is not a UUID or not this record's.
        """
        wanted = canonical_uuid_field(self._NAME, "uuid", uuid)
        if wanted != self.uuid:
            raise MalformedError(
                self._NAME, f"'uuid' is {self.uuid}, the node asked for is {wanted}"
            )

    @property
    def base_url(self) -> str:
        """``https://host:port`` of the node's agent (IPv6 in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}"

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"uuid": self.uuid}
        body.update(_contact_dict(self))
        body["activated"] = self.activated
        return body

    @classmethod
    def from_dict(cls, data: object) -> RegistrationRecord:
        """Parse the registrar's answer (unknown fields are ignored).

        Raises:
            MalformedError: as the constructor, or a field that is not base64.
        """
        r = Reader(data, cls._NAME)
        uuid = r.get("uuid")
        contact = _read_contact(r, cls._NAME)
        return cls(uuid=uuid, activated=r.get("activated"), **contact)


@dataclasses.dataclass(frozen=True)
class AgentLookup:
    """The verifier's question for a batch of enrolments: the registrations
    of these nodes, and where Nova placed them, in one request.

    Raises:
        FieldError: ``uuids`` not a list of 1 to :data:`MAX_LOOKUP`
            strings.
        MalformedError: an item is not a UUID (named by its index).
    """

    uuids: tuple[str, ...]

    _NAME = "agent look-up"

    def __post_init__(self) -> None:
        items = self.uuids
        if not isinstance(items, (list, tuple)) or not 1 <= len(items) <= MAX_LOOKUP:
            raise FieldError(
                self._NAME, "uuids", f"must be a list of 1 to {MAX_LOOKUP} UUIDs"
            )
        canonical = tuple(
            canonical_uuid_field(self._NAME, f"uuids.{i}", u)
            for i, u in enumerate(items)
        )
        object.__setattr__(self, "uuids", canonical)

    def to_dict(self) -> dict[str, Any]:
        return {"uuids": list(self.uuids)}

    @classmethod
    def from_dict(cls, data: object) -> AgentLookup:
        """Raises: MalformedError naming the field (unknown ones refused)."""
        r = Reader(data, cls._NAME)
        uuids = r.get("uuids")
        r.finish()
        return cls(uuids)


@dataclasses.dataclass(frozen=True)
class AgentLookupResult:
    """The registrar's answer to :class:`AgentLookup`: the records of the
    nodes it knows (the others are left out) and the compute host of those
    Nova placed.

    Raises:
        FieldError, MalformedError: a record as :class:`RegistrationRecord`
            refuses it, or a placement that is not UUID -> host name.
    """

    agents: tuple[RegistrationRecord, ...]
    placements: dict[str, str]

    _NAME = "agent look-up result"

    def __post_init__(self) -> None:
        if not isinstance(self.placements, dict):
            raise FieldError(self._NAME, "placements", "must be an object")
        for uuid, host in self.placements.items():
            canonical_uuid_field(self._NAME, "placements", uuid)
            check_host_name(self._NAME, f"placements.{uuid}", host)

    def to_dict(self) -> dict[str, Any]:
        return {
            "agents": [a.to_dict() for a in self.agents],
            "placements": dict(self.placements),
        }

    @classmethod
    def from_dict(cls, data: object) -> AgentLookupResult:
        """Parse the registrar's answer (unknown fields are ignored).

        Raises:
            MalformedError: as the constructor.
        """
        r = Reader(data, cls._NAME)
        agents, placements = r.get("agents"), r.get("placements")
        if not isinstance(agents, list) or len(agents) > MAX_LOOKUP:
            raise FieldError(
                cls._NAME, "agents", f"must be a list of at most {MAX_LOOKUP} records"
            )
        return cls(tuple(RegistrationRecord.from_dict(a) for a in agents), placements)
