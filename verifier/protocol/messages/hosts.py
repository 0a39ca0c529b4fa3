"""Compute host enrolment (trusted compute pools, issue 29): the operator
enrols a compute host for attestation under its compute node's Placement
resource provider.

``POST /v1/hosts``  :class:`HostEnrolmentRequest`

A request: fields it does not define are refused. A host carries no
tenant payload: there is no V and no commitment to U (the verifier never
releases anything to a host agent; a host is attested from its first
good quote, :mod:`verifier.protocol.attestation.hosts`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from verifier.protocol.errors import FieldError
from verifier.protocol.messages._fields import (
    Reader,
    canonical_uuid_field,
    check_host,
    check_str,
)
from verifier.protocol.messages.enrolment import MAX_POLICY_REF, check_interval
from verifier.protocol.policy import PcrPolicy

__all__ = ["DEFAULT_CA_PATH", "HostEnrolmentRequest"]

#: Where swtpm_localca keeps the local CA certificate that signs the host's
#: vTPM EK certificates (its ``statedir`` in /etc/swtpm-localca.conf).
DEFAULT_CA_PATH = "/var/lib/swtpm-localca/issuercert.pem"
_MAX_PATH = 4096


@dataclasses.dataclass(frozen=True)
class HostEnrolmentRequest:
    """Enrol a compute host.

    Attributes:
        provider: its compute node's Placement resource provider UUID
            (canonical form): the host's node UUID, under which its host
            agent registers.
        hypervisor_hostname: its hypervisor host name (Nova's ``host`` of
            the instances it runs).
        policy: allowed PCR values (may be empty when a runtime or
            measured-boot policy is named).
        runtime_policy: a stored IMA runtime policy reference (of the
            caller's project), or None.
        mb_policy: a stored measured-boot policy reference, or None.
        ca_path: the swtpm local CA certificate file whose measurement in
            the host's IMA list proves its CA.
        interval: the host's own seconds between quotes (None: the
            verifier's).

    Raises:
        FieldError: a field of the wrong type or size, or nothing to check.
        MalformedError: ``provider`` is not a UUID, the host name is not a
            DNS name, or the policy does not parse.
    """

    provider: str
    hypervisor_hostname: str
    policy: PcrPolicy
    runtime_policy: str | None = None
    mb_policy: str | None = None
    ca_path: str = DEFAULT_CA_PATH
    interval: float | None = None

    _NAME = "host enrolment request"

    def __post_init__(self) -> None:
        canonical = canonical_uuid_field(self._NAME, "provider", self.provider)
        object.__setattr__(self, "provider", canonical)
        check_host(self._NAME, "hypervisor_hostname", self.hypervisor_hostname)
        if not isinstance(self.policy, PcrPolicy):
            raise FieldError(self._NAME, "policy", "must be a PCR policy")
        for name in ("runtime_policy", "mb_policy"):
            check_str(
                self._NAME, name, getattr(self, name), MAX_POLICY_REF, optional=True
            )
        check_str(self._NAME, "ca_path", self.ca_path, _MAX_PATH)
        if not self.ca_path.startswith("/"):
            raise FieldError(self._NAME, "ca_path", "must be an absolute path")
        object.__setattr__(self, "interval", check_interval(self._NAME, self.interval))
        if (
            not self.policy.pcrs
            and self.runtime_policy is None
            and self.mb_policy is None
        ):
            raise FieldError(
                self._NAME, "policy", "give a PCR, runtime or measured-boot policy"
            )

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "provider": self.provider,
            "hypervisor_hostname": self.hypervisor_hostname,
            "policy": self.policy.to_dict(),
            "runtime_policy": self.runtime_policy,
            "mb_policy": self.mb_policy,
            "ca_path": self.ca_path,
        }
        if self.interval is not None:
            body["interval"] = self.interval
        return body

    @classmethod
    def from_dict(cls, data: object) -> HostEnrolmentRequest:
        """Parse a request body (unknown fields are refused; a missing or
        null ``policy`` is the empty one).

        Raises:
            FieldError, MalformedError: as the constructor.
        """
        r = Reader(data, cls._NAME)
        provider = r.get("provider")
        name = r.get("hypervisor_hostname")
        runtime, mb = r.get("runtime_policy"), r.get("mb_policy")
        document = r.get("policy")
        ca_path = r.get("ca_path")
        interval = r.get("interval")
        r.finish()
        if provider is None:
            raise FieldError(cls._NAME, "provider", "is required")
        if name is None:
            raise FieldError(cls._NAME, "hypervisor_hostname", "is required")
        policy = (
            PcrPolicy({})
            if document is None
            else PcrPolicy.from_dict(document, allow_empty=True)
        )
        return cls(
            provider,
            name,
            policy,
            runtime,
            mb,
            DEFAULT_CA_PATH if ca_path is None else ca_path,
            interval,
        )
