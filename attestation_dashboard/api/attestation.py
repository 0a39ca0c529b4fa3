"""The one HTTP client of the dashboard: the attestation API (the
verifier's ``/v1``) as the logged-in user.

The endpoint is the Keystone catalog's service type ``attestation``
(:func:`openstack_dashboard.api.base.url_for`) and every call carries the
user's own token (``X-Auth-Token``): the API decides what the user may
see and do by its policy, exactly as for the CLI; the dashboard never holds
a service credential. TLS is verified as Horizon verifies its other
services (``OPENSTACK_SSL_CACERT``, ``OPENSTACK_SSL_NO_VERIFY``).

Every failure becomes one error of :mod:`attestation_dashboard.exceptions`:
:class:`AttestationUnreachableError` for no endpoint, a refused
connection, a timeout (:data:`TIMEOUT` seconds), a TLS failure or an
answer that is not the API's; :class:`AttestationNotFoundError` (404),
:class:`AttestationForbiddenError` (401, 403) and
:class:`AttestationRefusedError` (other 4xx) with the API's error code and
message. Once a request found the API unreachable, the later calls of the
same page fail at once (one wait, one message).

The answers are parsed once into the small classes below (the tables show
their attributes); a field the API does not send (an older verifier) is
shown empty, never an error.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import requests
from django.conf import settings
from horizon import exceptions as horizon_exceptions
from openstack_dashboard.api import base

from attestation_dashboard.exceptions import (
    AttestationForbiddenError,
    AttestationNotFoundError,
    AttestationRefusedError,
    AttestationUnreachableError,
)

__all__ = [
    "POLICY_KINDS",
    "SERVICE_TYPE",
    "TIMEOUT",
    "Event",
    "HistoryEntry",
    "Host",
    "Node",
    "PolicyVersion",
    "check_policy",
    "delete_node",
    "event_list",
    "host_list",
    "node_get",
    "node_history",
    "node_list",
    "policy_get",
    "policy_list",
    "policy_upload",
    "revoke_node",
    "set_node_policy",
    "stats",
]

#: The catalog's service type of the attestation API.
SERVICE_TYPE = "attestation"
#: Seconds a call may take (connect, and each read) before the API counts
#: as unreachable.
TIMEOUT = 5.0
#: The policy kinds, as the API names them in its paths.
POLICY_KINDS = ("runtime", "measured-boot")
_UNREACHABLE = "_attestation_unreachable"
_MAX_REASON = 160


def _text(value: object) -> str:
    return "" if value is None else str(value)


def _time(value: object) -> str:
    """An API time (ISO 8601 text, or seconds since the epoch) as ISO
    8601 UTC text ('' when absent)."""
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, (int, float)):
        when = datetime.datetime.fromtimestamp(float(value), datetime.UTC)
        return when.strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value)


def _seconds(value: object) -> float | None:
    """An API time as seconds since the epoch (None: absent or unreadable)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        when = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclasses.dataclass(frozen=True)
class Node:
    """A node as ``GET /v1/nodes`` shows it."""

    uuid: str
    state: str
    mode: str
    project_id: str
    failure_reason: str
    last_attested_at: str
    last_attested_age: float | None
    trusted: bool | None
    quotes_verified: int
    policies: Mapping[str, Mapping[str, Any] | None]
    host: Mapping[str, Any] | None

    @property
    def id(self) -> str:  # noqa: A003 (Horizon tables look for ``id``)
        return self.uuid

    @property
    def last_good(self) -> str:
        """The age of the last good quote, for people."""
        age = self.last_attested_age
        if age is None:
            return "never" if not self.last_attested_at else self.last_attested_at
        return f"{_duration(age)} ago"

    @property
    def policy(self) -> str:
        """The policies in force: ``runtime: name v3; measured-boot: ...``."""
        parts = []
        for kind in POLICY_KINDS:
            ref = self.policies.get(kind)
            if not ref:
                continue
            name = ref.get("name") or _text(ref.get("digest"))[:12]
            version = ref.get("version")
            shown = f"{name} v{version}" if version is not None else name
            if ref.get("follows"):
                shown += " (follows)"
            parts.append(f"{kind}: {shown}")
        return "; ".join(parts)

    def policy_ref(self, kind: str) -> str:
        """The reference of the ``kind`` policy in force, as the change form
        offers it (``name`` when it follows the name, else ``name@v``)."""
        ref = self.policies.get(kind)
        if not ref or not ref.get("name"):
            return ""
        if ref.get("follows"):
            return str(ref["name"])
        return f"{ref['name']}@{ref.get('version')}"

    @property
    def host_trust(self) -> str:
        """Its compute host's verdict ('' when its host is not known)."""
        if not self.host:
            return ""
        name = _text(self.host.get("name"))
        trusted = self.host.get("trusted")
        verdict = (
            "unknown"
            if not isinstance(trusted, bool)
            else ("trusted" if trusted else "untrusted")
        )
        return f"{verdict} ({name})" if name else verdict

    @property
    def host_name(self) -> str:
        return _text((self.host or {}).get("name"))

    @classmethod
    def from_dict(cls, data: object) -> Node:
        d = _mapping(data)
        policies = {
            str(k): (v if isinstance(v, Mapping) else None)
            for k, v in _mapping(d.get("policies")).items()
        }
        age = d.get("last_attested_age")
        trusted = d.get("trusted")
        host = d.get("host")
        return cls(
            uuid=_text(d.get("uuid")),
            state=_text(d.get("state")),
            mode=_text(d.get("mode")),
            project_id=_text(d.get("project_id")),
            failure_reason=_text(d.get("failure_reason")),
            last_attested_at=_time(d.get("last_attested_at")),
            last_attested_age=float(age) if isinstance(age, (int, float)) else None,
            trusted=trusted if isinstance(trusted, bool) else None,
            quotes_verified=int(d.get("quotes_verified") or 0),
            policies=policies,
            host=host if isinstance(host, Mapping) else None,
        )


@dataclasses.dataclass(frozen=True)
class Event:
    """A signed event of ``GET /v1/events`` (its fields, not verified)."""

    id: str  # noqa: A003
    node_uuid: str
    type: str  # noqa: A003
    reason: str
    detail: str
    time: str

    @classmethod
    def from_dict(cls, data: object) -> Event:
        d = _mapping(data)
        return cls(
            id=_text(d.get("id")),
            node_uuid=_text(d.get("node_uuid")),
            type=_text(d.get("type")),
            reason=_text(d.get("reason")),
            detail=_text(d.get("detail")),
            time=_time(d.get("created_at")),
        )


@dataclasses.dataclass(frozen=True)
class HistoryEntry:
    """One entry of a node's attestation log (``/v1/nodes/{uuid}/history``):
    a change of the verifier's word on it."""

    index: int
    kind: str
    reason: str
    detail: str
    created_at: float | None

    @classmethod
    def from_dict(cls, data: object) -> HistoryEntry:
        d = _mapping(_mapping(data).get("entry"))
        index = d.get("index")
        return cls(
            index=index if isinstance(index, int) else -1,
            kind=_text(d.get("kind")),
            reason=_text(d.get("reason")),
            detail=_text(d.get("detail")),
            created_at=_seconds(d.get("created_at")),
        )


@dataclasses.dataclass(frozen=True)
class PolicyVersion:
    """One stored policy version (``GET /v1/policies/{kind}``)."""

    kind: str
    name: str
    version: int | None
    digest: str
    entries: int | None
    signed: bool
    created_at: str
    document: Any = None

    @classmethod
    def from_dict(cls, data: object, kind: str) -> PolicyVersion:
        d = _mapping(data)
        version, entries = d.get("version"), d.get("entries")
        return cls(
            kind=_text(d.get("kind")) or kind,
            name=_text(d.get("name")) or _text(d.get("digest"))[:12],
            version=version if isinstance(version, int) else None,
            digest=_text(d.get("digest")),
            entries=entries if isinstance(entries, int) else None,
            signed=bool(d.get("signed")),
            created_at=_time(d.get("created_at")),
            document=d.get("policy"),
        )


@dataclasses.dataclass(frozen=True)
class Host:
    """A compute host (``GET /v1/hosts``, the operator's)."""

    uuid: str
    hypervisor_hostname: str
    state: str
    trusted: bool | None
    failure_reason: str
    as_of: str
    last_attested_at: str

    @property
    def id(self) -> str:  # noqa: A003
        return self.uuid or self.hypervisor_hostname

    @classmethod
    def from_dict(cls, data: object) -> Host:
        d = _mapping(data)
        trusted = d.get("trusted")
        return cls(
            uuid=_text(d.get("uuid") or d.get("provider")),
            hypervisor_hostname=_text(d.get("hypervisor_hostname")),
            state=_text(d.get("state")),
            trusted=trusted if isinstance(trusted, bool) else None,
            failure_reason=_text(d.get("failure_reason")),
            as_of=_time(d.get("as_of")),
            last_attested_at=_time(d.get("last_attested_at")),
        )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"


def _short(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MAX_REASON else line[: _MAX_REASON - 1] + "…"


def _endpoint(request: Any) -> str:
    try:
        url = str(base.url_for(request, SERVICE_TYPE))
    except horizon_exceptions.ServiceCatalogException as exc:
        raise AttestationUnreachableError(
            f"no '{SERVICE_TYPE}' endpoint in the service catalog"
        ) from exc
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def _verify() -> bool | str:
    if getattr(settings, "OPENSTACK_SSL_NO_VERIFY", False):
        return False
    cacert = getattr(settings, "OPENSTACK_SSL_CACERT", None)
    return str(cacert) if cacert else True


def _reason(exc: requests.RequestException) -> str:
    if isinstance(exc, requests.Timeout):
        return f"no answer within {TIMEOUT:g} s"
    if isinstance(exc, requests.exceptions.SSLError):
        return "TLS failed: " + _short(str(exc.__context__ or exc))
    if isinstance(exc, requests.ConnectionError):
        text = str(exc)
        if "Connection refused" in text or "Errno 111" in text:
            return "connection refused"
        if "Name or service not known" in text or "Errno -2" in text:
            return "unknown host name"
        return "connection failed"
    return _short(str(exc)) or type(exc).__name__


def _refusal(response: requests.Response) -> AttestationRefusedError:
    try:
        error = _mapping(_mapping(response.json()).get("error"))
    except ValueError:
        error = {}
    code = _text(error.get("code")) or "error"
    message = _short(_text(error.get("message")) or response.reason or "refused")
    status = response.status_code
    if status == 404:
        return AttestationNotFoundError(status, code, message)
    if status in (401, 403):
        return AttestationForbiddenError(status, code, message)
    return AttestationRefusedError(status, code, message)


def _call(
    request: Any,
    method: str,
    path: str,
    params: Mapping[str, str] | None = None,
    body: object = None,
) -> Any:
    """One API call as the user of ``request``: the JSON answer (None for
    204).

    Raises:
        AttestationUnreachableError, AttestationRefusedError (and its
        not-found and forbidden kinds).
    """
    known = getattr(request, _UNREACHABLE, None)
    if known is not None:
        raise AttestationUnreachableError(known)
    try:
        return _do_call(request, method, path, params, body)
    except AttestationUnreachableError as exc:
        setattr(request, _UNREACHABLE, exc.reason)
        raise


def _do_call(
    request: Any,
    method: str,
    path: str,
    params: Mapping[str, str] | None,
    body: object,
) -> Any:
    url = _endpoint(request) + path
    headers = {
        "X-Auth-Token": request.user.token.id,
        "Accept": "application/json",
    }
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode()
    try:
        response = requests.request(
            method,
            url,
            params=params,
            data=data,
            headers=headers,
            timeout=TIMEOUT,
            verify=_verify(),
            allow_redirects=False,
        )
    except requests.RequestException as exc:
        raise AttestationUnreachableError(_reason(exc)) from exc
    if 400 <= response.status_code < 500:
        raise _refusal(response)
    if response.status_code >= 300:
        raise AttestationUnreachableError(
            f"the API answered {response.status_code} {response.reason}"
        )
    if response.status_code == 204 or not response.content:
        return None
    try:
        return response.json()
    except ValueError as exc:
        raise AttestationUnreachableError("the API's answer is not JSON") from exc


def _node_path(uuid: str) -> str:
    return "/nodes/" + quote(uuid, safe="")


def node_list(request: Any) -> list[Node]:
    """The nodes the user may see (a project's; every project's for a
    cloud administrator, by the API's ``attestation:all_projects``)."""
    data = _mapping(_call(request, "GET", "/nodes"))
    return [Node.from_dict(item) for item in data.get("nodes") or ()]


def node_get(request: Any, uuid: str) -> Node:
    return Node.from_dict(_call(request, "GET", _node_path(uuid)))


def event_list(
    request: Any,
    node: str | None = None,
    kind: str | None = None,
    limit: int = 50,
) -> list[Event]:
    """The newest events (of ``node``, of ``kind``), newest first."""
    params = {"limit": str(limit)}
    if node is not None:
        params["node"] = node
    if kind is not None:
        params["kind"] = kind
    data = _mapping(_call(request, "GET", "/events", params=params))
    return [Event.from_dict(item) for item in data.get("events") or ()]


def node_history(request: Any, uuid: str) -> list[HistoryEntry]:
    """A node's entries in the attestation log, oldest first (the proofs
    are not checked here: ``openstack attestation node history`` does)."""
    data = _mapping(_call(request, "GET", _node_path(uuid) + "/history"))
    entries = [HistoryEntry.from_dict(item) for item in data.get("entries") or ()]
    return sorted(entries, key=lambda e: e.index)


def revoke_node(request: Any, uuid: str, detail: str) -> Node:
    body = {"detail": detail}
    return Node.from_dict(
        _call(request, "POST", _node_path(uuid) + "/revoke", None, body)
    )


def delete_node(request: Any, uuid: str) -> None:
    _call(request, "DELETE", _node_path(uuid))


def set_node_policy(request: Any, uuid: str, changes: Mapping[str, str | None]) -> Node:
    """Change the policies in force: ``runtime_policy`` and/or
    ``mb_policy``, each a reference (``name`` follows it, ``name@v`` pins
    one) or None (no policy of that kind)."""
    path = _node_path(uuid) + "/policy"
    return Node.from_dict(_call(request, "PUT", path, None, dict(changes)))


def policy_list(
    request: Any, kinds: Sequence[str] = POLICY_KINDS
) -> list[PolicyVersion]:
    """Every stored version of the user's project's policies."""
    out: list[PolicyVersion] = []
    for kind in kinds:
        data = _mapping(_call(request, "GET", f"/policies/{kind}"))
        out.extend(
            PolicyVersion.from_dict(row, kind) for row in data.get("policies") or ()
        )
    return out


def policy_get(request: Any, kind: str, ref: str) -> PolicyVersion:
    """One version with its document (``ref``: ``name``, ``name@v`` or a
    digest)."""
    path = f"/policies/{quote(kind, safe='')}/{quote(ref, safe='@')}"
    return PolicyVersion.from_dict(_call(request, "GET", path), kind)


def policy_upload(
    request: Any, kind: str, name: str, document: object
) -> PolicyVersion:
    """Store ``document`` as the next version of ``name``."""
    body = {"policy": document, "name": name}
    path = f"/policies/{quote(kind, safe='')}"
    return PolicyVersion.from_dict(_call(request, "POST", path, None, body), kind)


def check_policy(request: Any, ref: str) -> Mapping[str, Any]:
    """The dry run of runtime policy ``ref`` on all the project's nodes:
    ``{"policy": ..., "results": [{"node", "result", "entries",
    "failures_total", "error"}, ...]}``."""
    path = f"/policies/runtime/{quote(ref, safe='@')}/check"
    return _mapping(_call(request, "POST", path, None, {"all": True}))


def stats(request: Any) -> Mapping[str, Any]:
    """The verifier's counters (``GET /v1/stats``, operators only)."""
    return _mapping(_call(request, "GET", "/stats"))


def host_list(request: Any) -> list[Host]:
    """The compute hosts and their verdicts (operators only)."""
    data = _mapping(_call(request, "GET", "/hosts"))
    return [Host.from_dict(item) for item in data.get("hosts") or ()]
