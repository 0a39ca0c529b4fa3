"""``GET /metrics``: the process's Prometheus metrics
(:mod:`verifier.common.metrics`; doc/source/admin/monitoring.rst), in the
Prometheus text format, or OpenMetrics when the scraper asks for it in
``Accept``. Guarded by the policy rule ``attestation:metrics:get`` (Keystone
tokens and the verifier's certificate identities) and, on the registrar
and the key service, by their certificate roles.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from verifier.api.authz import rule
from verifier.common import metrics
from verifier.common.web import Handler, allow

__all__ = ["METRICS_PATH", "add_metrics_route"]

METRICS_PATH = "/metrics"
RULE = "attestation:metrics:get"


def _handler(refresh: Callable[[], Awaitable[None]] | None) -> Handler:
    async def serve(request: web.Request) -> web.Response:
        if refresh is not None:
            await refresh()
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(
            body=encode(metrics.REGISTRY), headers={"Content-Type": content_type}
        )

    return serve


def add_metrics_route(
    app: web.Application,
    refresh: Callable[[], Awaitable[None]] | None = None,
    roles: tuple[str, ...] = (),
) -> None:
    """Serve ``GET /metrics`` on ``app``.

    Args:
        app: the service's application.
        refresh: sets the service's gauges before each scrape (None: it
            has none).
        roles: the certificate roles that may scrape, on a service whose
            machine identities are checked by role (the registrar, the key
            service); empty: the policy rule alone decides.
    """
    handler = rule(RULE)(_handler(refresh))
    if roles:
        handler = allow(*roles)(handler)
    app.router.add_get(METRICS_PATH, handler)
