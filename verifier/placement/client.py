"""The verifier's Placement client: a resource provider's traits,
read-modify-write with the provider generation.

Placement API (microversion :data:`MICROVERSION`; error codes need 1.23):

* ``GET /resource_providers/{uuid}/traits`` -> ``{"traits": [...],
  "resource_provider_generation": g}``;
* ``PUT /traits/{name}`` creates a custom trait (201, or 204 if it exists);
* ``PUT /resource_providers/{uuid}/traits`` with ``{"traits": [...],
  "resource_provider_generation": g}`` replaces the provider's traits; 409
  with code ``placement.concurrent_update`` when another writer changed
  the provider since ``g`` was read: read again and retry.

Every call goes through one keystoneauth adapter (a Keystone session, or
the ``noauth`` headers of a Placement without authtoken), and every failure
becomes one :class:`PlacementError` naming the provider.
"""

from __future__ import annotations

import enum
import re
import uuid as uuid_mod
from typing import Any

import requests
from keystoneauth1 import adapter as ks_adapter
from keystoneauth1 import exceptions as ks_exceptions
from keystoneauth1 import loading as ks_loading
from keystoneauth1 import noauth as ks_noauth
from keystoneauth1 import session as ks_session
from oslo_config import cfg

from verifier.conf import placement as placement_conf
from verifier.exceptions import ConfigError, VerifierError

__all__ = [
    "MICROVERSION",
    "NOAUTH_HEADERS",
    "PlacementClient",
    "PlacementError",
    "PlacementReason",
    "check_trait",
    "noauth_adapter",
]

#: Placement microversion of every request (1.6: traits; 1.23: error codes).
MICROVERSION = "1.23"
#: What a Placement without authtoken (``auth_strategy = noauth2``) needs.
NOAUTH_HEADERS = {"X-Auth-Token": "admin", "X-Roles": "admin,service"}
_CONCURRENT_UPDATE = "placement.concurrent_update"
_CUSTOM_TRAIT = re.compile(r"CUSTOM_[A-Z0-9_]{1,248}")


class PlacementReason(enum.StrEnum):
    """Why a Placement call failed."""

    #: no HTTP answer: connection refused, timeout, TLS or endpoint lookup
    UNREACHABLE = "placement_unreachable"
    #: the resource provider does not exist (404)
    PROVIDER_NOT_FOUND = "provider_not_found"
    #: still 409 placement.concurrent_update after every attempt
    CONFLICT = "placement_conflict"
    #: any other refusal (4xx, 5xx)
    REFUSED = "placement_refused"
    #: a 2xx answer that is not the documented JSON
    BAD_ANSWER = "placement_bad_answer"
    #: the caller's provider is not a UUID
    BAD_PROVIDER = "bad_provider"


class PlacementError(VerifierError):
    """A Placement call that did not do what was asked.

    Attributes:
        reason: a :class:`PlacementReason`.
        provider: the resource provider UUID the call was about ("" for a
            call about a trait only).
        detail: what happened, naming the provider.
        status: the HTTP status, or None without an answer.
    """

    def __init__(
        self,
        reason: PlacementReason,
        provider: str,
        detail: str,
        status: int | None = None,
    ) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.provider = provider
        self.detail = detail
        self.status = status


def check_trait(trait: str) -> str:
    """Return ``trait`` if it is a custom trait name (``CUSTOM_[A-Z0-9_]+``).

    Raises:
        ConfigError: it is not.
    """
    if not isinstance(trait, str) or not _CUSTOM_TRAIT.fullmatch(trait):
        raise ConfigError(f"{trait!r} is not a custom trait (CUSTOM_[A-Z0-9_]+)")
    return trait


def noauth_adapter(endpoint: str, timeout: float = 10.0) -> ks_adapter.Adapter:
    """A keystoneauth adapter for a Placement without authtoken at
    ``endpoint``: no Keystone, :data:`NOAUTH_HEADERS` on every request."""
    session = ks_session.Session(
        auth=ks_noauth.NoAuth(endpoint=endpoint), timeout=timeout
    )
    return ks_adapter.Adapter(
        session,
        service_type=placement_conf.SERVICE_TYPE,
        endpoint_override=endpoint,
        additional_headers=dict(NOAUTH_HEADERS),
        default_microversion=MICROVERSION,
    )


def _error_code(response: requests.Response) -> str:
    try:
        errors = response.json().get("errors") or [{}]
        return str(errors[0].get("code", ""))
    except (ValueError, AttributeError, TypeError, IndexError):
        return ""


def _error_text(response: requests.Response) -> str:
    try:
        errors = response.json().get("errors") or [{}]
        text = str(errors[0].get("detail") or errors[0].get("title") or "")
    except (ValueError, AttributeError, TypeError, IndexError):
        text = response.text
    return " ".join(text.split())[:200]


class PlacementClient:
    """Traits of resource providers, through one keystoneauth adapter.

    Build it with :meth:`from_conf` (``[placement]``) or :meth:`noauth`.

    Args:
        adapter: a keystoneauth adapter for the placement service.
        conflict_retries: read-modify-write attempts per change on 409
            ``placement.concurrent_update``.

    Attributes:
        requests: how many HTTP requests this client has made (answered or
            not); the benchmark counts them.
    """

    def __init__(
        self, adapter: ks_adapter.Adapter, *, conflict_retries: int = 4
    ) -> None:
        if conflict_retries < 1:
            raise ConfigError("conflict_retries must be at least 1")
        self._adapter = adapter
        self._attempts = conflict_retries
        self._known_traits: set[str] = set()
        self.requests = 0

    @classmethod
    def noauth(
        cls, endpoint: str, *, timeout: float = 10.0, conflict_retries: int = 4
    ) -> PlacementClient:
        """A client of a Placement without authtoken at ``endpoint``
        (sends :data:`NOAUTH_HEADERS`)."""
        adapter = noauth_adapter(endpoint, timeout)
        return cls(adapter, conflict_retries=conflict_retries)

    @classmethod
    def from_conf(cls, conf: cfg.ConfigOpts) -> PlacementClient:
        """The client ``[placement]`` describes (its options must be
        registered: :func:`verifier.conf.placement.register_opts`).

        Raises:
            ConfigError: ``noauth`` without ``endpoint_override``, or
                keystoneauth options that do not load.
        """
        group = conf[placement_conf.GROUP]
        if group.noauth:
            if not group.endpoint_override:
                raise ConfigError("[placement] noauth needs endpoint_override")
            return cls.noauth(
                group.endpoint_override,
                timeout=group.timeout or 10.0,
                conflict_retries=group.conflict_retries,
            )
        try:
            auth = ks_loading.load_auth_from_conf_options(conf, placement_conf.GROUP)
            session = ks_loading.load_session_from_conf_options(
                conf, placement_conf.GROUP, auth=auth
            )
            adapter = ks_loading.load_adapter_from_conf_options(
                conf,
                placement_conf.GROUP,
                session=session,
                auth=auth,
                default_microversion=MICROVERSION,
            )
        except (ks_exceptions.ClientException, cfg.Error, ValueError) as exc:
            raise ConfigError(f"[placement]: {exc}") from None
        return cls(adapter, conflict_retries=group.conflict_retries)

    # -- public calls ---------------------------------------------------------

    def get_traits(self, provider: str) -> tuple[int, set[str]]:
        """The provider's generation and traits.

        Raises:
            PlacementError: naming ``provider``.
        """
        path = f"/resource_providers/{_provider(provider)}/traits"
        response = self._call("GET", path, provider)
        if response.status_code == 404:
            raise PlacementError(
                PlacementReason.PROVIDER_NOT_FOUND,
                provider,
                f"resource provider {provider} does not exist",
                404,
            )
        self._expect(response, (200,), provider, "read the traits of")
        return self._parse_traits(response, provider)

    def set_trait(self, provider: str, trait: str, present: bool) -> bool:
        """Put ``trait`` on ``provider`` (``present``) or take it off,
        keeping every other trait.

        Read-modify-write with the provider generation; on 409
        ``placement.concurrent_update`` read again and retry, up to
        ``conflict_retries`` writes.

        Returns:
            True if this call changed the provider, False if it already was
            as asked.

        Raises:
            PlacementError: naming ``provider``; the change may not have
                landed.
            ConfigError: ``trait`` is not a custom trait.
        """
        check_trait(trait)
        for _ in range(self._attempts):
            generation, traits = self.get_traits(provider)
            if (trait in traits) == present:
                return False
            if present:
                self._ensure_trait(trait, provider)
                wanted = traits | {trait}
            else:
                wanted = traits - {trait}
            if self._put_traits(provider, generation, wanted):
                return True
        raise PlacementError(
            PlacementReason.CONFLICT,
            provider,
            f"resource provider {provider} changed under every one of "
            f"{self._attempts} writes of trait {trait}",
            409,
        )

    # -- private ------------------------------------------------------------------

    def _call(
        self, method: str, path: str, provider: str, body: dict[str, Any] | None = None
    ) -> requests.Response:
        self.requests += 1
        try:
            response: requests.Response = self._adapter.request(
                path, method, json=body, raise_exc=False
            )
        except (
            ks_exceptions.ClientException,
            requests.RequestException,
            OSError,
        ) as exc:
            raise PlacementError(
                PlacementReason.UNREACHABLE,
                provider,
                f"Placement did not answer {method} {path} (resource provider "
                f"{provider}): {type(exc).__name__}",
            ) from None
        return response

    def _expect(
        self,
        response: requests.Response,
        statuses: tuple[int, ...],
        provider: str,
        what: str,
    ) -> None:
        if response.status_code not in statuses:
            raise PlacementError(
                PlacementReason.REFUSED,
                provider,
                f"Placement answered {response.status_code} when asked to {what} "
                f"resource provider {provider}: {_error_text(response)}",
                response.status_code,
            )

    def _parse_traits(
        self, response: requests.Response, provider: str
    ) -> tuple[int, set[str]]:
        try:
            data = response.json()
            generation, traits = data["resource_provider_generation"], data["traits"]
        except (ValueError, KeyError, TypeError):
            generation, traits = None, None
        if (
            type(generation) is not int
            or not isinstance(traits, list)
            or not all(isinstance(t, str) for t in traits)
        ):
            raise PlacementError(
                PlacementReason.BAD_ANSWER,
                provider,
                f"the traits of resource provider {provider} are not the "
                "documented JSON",
                response.status_code,
            )
        return generation, set(traits)

    def _ensure_trait(self, trait: str, provider: str) -> None:
        if trait in self._known_traits:
            return
        response = self._call("PUT", f"/traits/{trait}", provider)
        self._expect(response, (201, 204), provider, f"create trait {trait} for")
        self._known_traits.add(trait)

    def _put_traits(self, provider: str, generation: int, traits: set[str]) -> bool:
        """One write; False on a generation conflict (read again)."""
        body = {"resource_provider_generation": generation, "traits": sorted(traits)}
        path = f"/resource_providers/{_provider(provider)}/traits"
        response = self._call("PUT", path, provider, body)
        if response.status_code == 409 and _error_code(response) == _CONCURRENT_UPDATE:
            return False
        if response.status_code == 400:
            self._known_traits.clear()  # a trait deleted since: create it again
        if response.status_code == 404:
            raise PlacementError(
                PlacementReason.PROVIDER_NOT_FOUND,
                provider,
                f"resource provider {provider} does not exist",
                404,
            )
        self._expect(response, (200,), provider, "write the traits of")
        return True


def _provider(provider: str) -> str:
    try:
        return str(uuid_mod.UUID(provider))
    except (ValueError, AttributeError, TypeError):
        raise PlacementError(
            PlacementReason.BAD_PROVIDER,
            str(provider)[:40],
            f"resource provider {str(provider)[:40]!r} is not a UUID",
        ) from None
