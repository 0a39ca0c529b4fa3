"""Whose instance is it? A Nova instance is enrolled only by its project.

Enrolment names an instance UUID, and with ``await_instance`` it may come
before the instance exists on a compute host, so nothing else ties the
UUID to the enrolling project: without a check, any project could claim
another's instance (or a UUID about to be used) and make its owner's
enrolment fail with ``already_enrolled``. Nova knows: the instance record
(and its project, ``tenant_id``) exists from the moment the compute API
accepted the boot request, which is before ``trusted-nova boot`` enrols.

:class:`NovaInstanceOwners` asks Nova's compute API, with the caller's own
Keystone token, at the compute endpoint of the caller's service catalog
(as keystonemiddleware passed it on): ``GET /servers/{uuid}``. Nova
answers 404 for an instance of another project, so the caller learns
nothing it could not learn from Nova itself.

The list of a project's instances (``GET /servers``) comes in pages of at
most Nova's ``[api] max_limit`` (1000 by default): :meth:`owned` follows
the ``next`` link of ``servers_links`` (``?limit=&marker=``) until the
last page, only to the same compute endpoint (the token goes nowhere
else), and fails closed on a loop or more than :data:`MAX_PAGES` pages.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from verifier.common.errors import TransportError
from verifier.common.http import AsyncClient
from verifier.exceptions import NotFoundError, RequestError

__all__ = ["MAX_PAGES", "NovaInstanceOwners", "compute_url"]

LOG = logging.getLogger(__name__)

#: The most pages of ``GET /servers`` read for one list (x Nova's max_limit).
MAX_PAGES = 1000


def compute_url(catalog: Sequence[Mapping[str, Any]], interface: str) -> str | None:
    """The compute endpoint of a service catalog (first region): the v2
    form keystonemiddleware passes on (``publicURL``, ...), or v3's."""
    for service in catalog or ():
        if service.get("type") != "compute":
            continue
        for endpoint in service.get("endpoints") or ():
            if not isinstance(endpoint, Mapping):
                continue
            url = endpoint.get(f"{interface}URL")
            if url is None and endpoint.get("interface") == interface:
                url = endpoint.get("url")
            if isinstance(url, str) and url:
                return url.rstrip("/")
    return None


class NovaInstanceOwners:
    """Checks an instance's project with Nova.

    Args:
        client: the HTTP client (TLS trust of the compute endpoint).
        interface: which catalog endpoint of Nova to use.
    """

    def __init__(self, client: AsyncClient, interface: str = "public") -> None:
        self._http = client
        self._interface = interface

    async def require_owned(
        self,
        uuid: str,
        project: str,
        token: str | None,
        catalog: Sequence[Mapping[str, Any]],
    ) -> None:
        """Succeed only if Nova shows instance ``uuid`` in ``project``.

        Raises:
            NotFoundError: ``unknown_instance``: Nova does not show it to the
                caller, or it belongs to another project.
            RequestError: ``compute_unavailable`` (503): no compute endpoint
                in the catalog, or Nova could not be asked (fail closed).
        """
        base = compute_url(catalog, self._interface)
        if base is None or not token:
            raise RequestError(
                "compute_unavailable", "no compute endpoint to check the instance", 503
            )
        try:
            answer = await self._http.request(
                "GET", f"{base}/servers/{uuid}", headers={"X-Auth-Token": token}
            )
        except TransportError as exc:
            LOG.warning("Cannot ask Nova about instance %s: %s", uuid, exc)
            raise RequestError(
                "compute_unavailable", "the compute service cannot be reached", 503
            ) from None
        server = answer.data.get("server") if isinstance(answer.data, dict) else None
        if answer.status == 404 or (
            answer.ok
            and isinstance(server, dict)
            and server.get("tenant_id") != project
        ):
            raise NotFoundError(
                "unknown_instance", f"no instance {uuid} in the caller's project"
            )
        if not answer.ok or not isinstance(server, dict):
            raise RequestError(
                "compute_unavailable", f"Nova answered HTTP {answer.status}", 503
            )

    async def owned(
        self, token: str | None, catalog: Sequence[Mapping[str, Any]]
    ) -> set[str]:
        """The instances Nova shows the token's project (``GET /servers``,
        every page).

        Raises:
            RequestError: ``compute_unavailable`` (503), as
                :meth:`require_owned`, also for a ``next`` link to another
                endpoint, a loop, or more than :data:`MAX_PAGES` pages.
        """
        base = compute_url(catalog, self._interface)
        if base is None or not token:
            raise RequestError(
                "compute_unavailable", "no compute endpoint to list instances", 503
            )
        found: set[str] = set()
        url: str | None = f"{base}/servers"
        seen: set[str] = set()
        while url is not None:
            if url in seen or len(seen) >= MAX_PAGES:
                raise RequestError(
                    "compute_unavailable",
                    f"Nova's server list did not end after {len(seen)} pages",
                    503,
                )
            seen.add(url)
            page, url = await self._page(url, token, base)
            found |= page
        return found

    async def _page(
        self, url: str, token: str, base: str
    ) -> tuple[set[str], str | None]:
        """One page of ``GET /servers``: its ids and the next page's URL."""
        try:
            answer = await self._http.request(
                "GET", url, headers={"X-Auth-Token": token}
            )
        except TransportError as exc:
            LOG.warning("Cannot ask Nova for the caller's instances: %s", exc)
            raise RequestError(
                "compute_unavailable", "the compute service cannot be reached", 503
            ) from None
        data = answer.data if isinstance(answer.data, dict) else {}
        servers = data.get("servers")
        if not answer.ok or not isinstance(servers, list):
            raise RequestError(
                "compute_unavailable", f"Nova answered HTTP {answer.status}", 503
            )
        ids = {
            str(s["id"]).lower()
            for s in servers
            if isinstance(s, dict) and isinstance(s.get("id"), str)
        }
        return ids, _next_link(data.get("servers_links"), base)

    async def close(self) -> None:
        await self._http.close()


def _next_link(links: object, base: str) -> str | None:
    """The ``next`` link of a page of ``GET /servers`` (None: last page).

    Raises:
        RequestError: ``compute_unavailable`` (503) for a link that is not
            on the compute endpoint ``base`` (the token is not sent there).
    """
    if not isinstance(links, list):
        return None
    for link in links:
        if not isinstance(link, Mapping) or link.get("rel") != "next":
            continue
        href = link.get("href")
        ours = urllib.parse.urlsplit(base)
        theirs = urllib.parse.urlsplit(href) if isinstance(href, str) else None
        if (
            theirs is None
            or (theirs.scheme, theirs.netloc) != (ours.scheme, ours.netloc)
            or not f"{theirs.path}/".startswith(f"{ours.path.rstrip('/')}/")
        ):
            raise RequestError(
                "compute_unavailable",
                "Nova's next page is not on its own compute endpoint",
                503,
            )
        return str(href)
    return None
