"""The verifier tells the registrar a compute host's trust (trusted compute
pools, issue 29): on every host verdict change and at its start-up, over
mTLS with its service certificate.

``PUT /v1/hosts/{host}/trust``  :class:`HostTrustUpdate` ->
                               :class:`HostTrustRecord` (200; 404 for a host
                               with no vTPM CA enrolled)
``GET /v1/hosts/{host}/trust``  -> :class:`HostTrustRecord`

An update older (``as_of``) than the one the registrar holds changes
nothing (``applied`` false), so a delayed retry never re-trusts a host the
verifier has since failed.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from typing import Any

from verifier.protocol.errors import FieldError
from verifier.protocol.hosttrust import HostTrust
from verifier.protocol.messages._fields import (
    Reader,
    canonical_uuid_field,
    check_bool,
)
from verifier.protocol.messages.provider import check_host_name

__all__ = ["HostTrustRecord", "HostTrustUpdate", "format_time", "parse_time"]

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_MAX_TIME = 40
_YEAR_10000 = 253402300800.0


def parse_time(structure: str, name: str, value: object) -> float:
    """An ISO 8601 time with a time zone (``Z`` or an offset), as seconds
    since the epoch.

    Raises:
        FieldError: not such a string.
    """
    if not isinstance(value, str) or len(value) > _MAX_TIME:
        raise FieldError(structure, name, "must be an ISO 8601 time string")
    text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise FieldError(structure, name, "is not an ISO 8601 time") from None
    if when.tzinfo is None:
        raise FieldError(structure, name, "needs a time zone (Z or an offset)")
    try:
        seconds = when.timestamp()
    except (ValueError, OverflowError):  # out of range once in UTC
        seconds = -1.0
    _check_time(structure, name, seconds)
    return seconds


def _check_time(structure: str, name: str, value: object) -> None:
    """Raises: FieldError unless ``value`` is seconds since the epoch
    between 1970 and 9999 (a number, not a boolean)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value < _YEAR_10000
    ):
        raise FieldError(structure, name, "must be a time between 1970 and 9999")


def format_time(seconds: float) -> str:
    """The ISO 8601 UTC form (``...Z``) of seconds since the epoch."""
    when = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return when.isoformat().replace("+00:00", "Z")


def _check_digest(structure: str, value: object) -> None:
    if value is not None and (
        not isinstance(value, str) or not _SHA256_HEX.fullmatch(value)
    ):
        raise FieldError(
            structure, "ca_sha256", "must be null or 64 lower-case hex digits"
        )


@dataclasses.dataclass(frozen=True)
class HostTrustUpdate:
    """One host's trust, as the verifier judged it (the host is in the path).

    Attributes:
        trusted: the host is attested.
        ca_sha256: sha256 (hex) of the vTPM CA file the host's IMA list
            showed, None if it showed none.
        provider: the host's compute node resource provider UUID.
        as_of: when the verifier judged it (seconds since the epoch; ISO
            8601 on the wire).

    Raises:
        FieldError: a field of the wrong type or form.
        MalformedError: ``provider`` is not a UUID.
    """

    trusted: bool
    ca_sha256: str | None
    provider: str
    as_of: float

    _NAME = "host trust update"

    def __post_init__(self) -> None:
        check_bool(self._NAME, "trusted", self.trusted)
        _check_digest(self._NAME, self.ca_sha256)
        canonical = canonical_uuid_field(self._NAME, "provider", self.provider)
        object.__setattr__(self, "provider", canonical)
        _check_time(self._NAME, "as_of", self.as_of)

    def trust(self) -> HostTrust:
        """The core's form of this update."""
        return HostTrust(self.trusted, self.ca_sha256, self.provider, self.as_of)

    def to_dict(self) -> dict[str, Any]:
        return {
            "trusted": self.trusted,
            "ca_sha256": self.ca_sha256,
            "provider": self.provider,
            "as_of": format_time(self.as_of),
        }

    @classmethod
    def from_dict(cls, data: object) -> HostTrustUpdate:
        """Parse a request body (unknown fields are refused).

        Raises:
            FieldError, MalformedError: as the constructor, naming the field.
        """
        r = Reader(data, cls._NAME)
        as_of = parse_time(cls._NAME, "as_of", r.get("as_of"))
        msg = cls(r.get("trusted"), r.get("ca_sha256"), r.get("provider"), as_of)
        r.finish()
        return msg


@dataclasses.dataclass(frozen=True)
class HostTrustRecord:
    """The registrar's trust record of a host.

    Attributes:
        host: the compute host's name.
        trust: the verifier's last word on it (None: never told).
        applied: for a PUT, whether the update was newer than the record
            (False: an older update, ignored); True for a GET.

    Raises:
        FieldError: a bad host name or ``applied``.
    """

    host: str
    trust: HostTrust | None
    applied: bool = True

    _NAME = "host trust record"

    def __post_init__(self) -> None:
        check_host_name(self._NAME, "host", self.host)
        check_bool(self._NAME, "applied", self.applied)

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"host": self.host, "applied": self.applied}
        if self.trust is None:
            body.update(trusted=False, ca_sha256=None, provider=None, as_of=None)
            return body
        update = HostTrustUpdate(
            self.trust.trusted,
            self.trust.ca_sha256,
            self.trust.provider,
            self.trust.as_of,
        )
        body.update(update.to_dict())
        return body

    @classmethod
    def from_dict(cls, data: object) -> HostTrustRecord:
        """Parse the registrar's answer (unknown fields are ignored).

        Raises:
            FieldError, MalformedError: naming the field.
        """
        r = Reader(data, cls._NAME)
        host, applied = r.get("host"), r.get("applied")
        if r.get("as_of") is None:
            return cls(host, None, applied)
        as_of = parse_time(cls._NAME, "as_of", r.get("as_of"))
        update = HostTrustUpdate(
            r.get("trusted"), r.get("ca_sha256"), r.get("provider"), as_of
        )
        return cls(host, update.trust(), applied)
