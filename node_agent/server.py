"""The node agent's REST API (aiohttp, served over HTTPS with client certs).

``GET  /v1/quote?nonce=<hex>&pcrs=16,17&csr=0|1``   a quote bound to NK (+CSR)
     ``&ima_from=N&mb=0|1``  plus IMA entries from N / the firmware log
``POST /v1/keys/u``  ``{"u": b64, "payload": b64, "payload_id"?: uuid}``
                     the tenant's share (``ShareU``); open to any client
                     (the tenant's relay through the verifier posts it
                     with the verifier's certificate): only the U matching
                     the enroller's commitment (with V) is combined
                     (:mod:`verifier.protocol.enroller`)
``POST /v1/keys/v``  ``{"v": b64, "identity_cert": PEM|null}``  the verifier's
                     (``ShareV``; both in :mod:`verifier.protocol.messages.shares`)
``GET  /v1/status``  bootstrap state

Policy-sealed data (CP-ABE keys, ``/v1/sealed``): :mod:`node_agent.abe`,
with the ``abe`` extra (pymcl); without it those routes answer 501
``extra_not_installed`` naming the extra.

Errors are JSON ``{"error": {"code", "message"}}`` (see :mod:`verifier.common.web`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping

from aiohttp import web

from node_agent.agent import Agent
from node_agent.evidence import EvidenceReader
from node_agent.exceptions import RefusedError, TpmError
from verifier.common import api_schemas, extras, openapi
from verifier.common.errors import RequestError
from verifier.common.web import (
    Handler,
    allow,
    authz_middleware,
    error_middleware,
    is_anonymous,
    json_response,
    peer_common_name,
    read_json,
)
from verifier.protocol.messages.quote import QuoteRequest, QuoteRequestError
from verifier.protocol.messages.shares import (
    MAX_PAYLOAD_ENVELOPE,
    ShareAccepted,
    ShareU,
    ShareV,
)

__all__ = ["make_app"]

_KEY = web.AppKey("agent", Agent)
_EVIDENCE = web.AppKey("evidence", EvidenceReader)
#: client certificate names in the tenant role (None: no check)
_TENANTS: web.AppKey[frozenset[str] | None] = web.AppKey("tenants")
#: The largest body: a payload envelope in base64 (4/3) and room for the rest.
_CLIENT_MAX_SIZE = (MAX_PAYLOAD_ENVELOPE * 4) // 3 + 64 * 1024


@allow("tenant", "verifier")
async def _quote(request: web.Request) -> web.Response:
    try:
        asked = QuoteRequest.from_query(request.query)
    except QuoteRequestError as exc:
        raise RequestError(exc.code, exc.detail) from exc
    try:
        answer = await request.app[_KEY].quote(
            asked.nonce, list(asked.pcrs), asked.csr, asked.banks
        )
    except TpmError as exc:
        raise RequestError("tpm_error", str(exc), 503)
    if asked.ima_from is not None or asked.mb:  # read after the quote: a superset
        reader = request.app[_EVIDENCE]
        answer = await asyncio.to_thread(
            reader.add_to, answer, asked.ima_from, asked.mb
        )
    return json_response(answer.to_dict())


@allow("tenant", "verifier", anonymous=True)
async def _keys_u(request: web.Request) -> web.Response:
    # anyone may offer U: only the enroller's (V's commitment) is combined.
    # The verifier relays a tenant's U (sealed to NK, opaque to it): that
    # U is no tenant certificate's, so it counts as anonymous.
    body = ShareU.from_dict(await read_json(request))
    agent = request.app[_KEY]
    tenants = request.app[_TENANTS]
    certified = not is_anonymous(request) and (
        tenants is None or peer_common_name(request) in tenants
    )
    done = await agent.receive_u(
        body.u, body.payload, body.payload_id, certified=certified
    )
    return json_response(ShareAccepted("u", done).to_dict())


@allow("verifier")
async def _keys_v(request: web.Request) -> web.Response:
    body = ShareV.from_dict(await read_json(request))
    cert = body.identity_cert
    agent = request.app[_KEY]
    done = await agent.receive_v(
        body.v, cert.encode() if cert is not None else None, body.u_commitment
    )
    return json_response(ShareAccepted("v", done).to_dict())


@allow("tenant", "verifier")
async def _status(request: web.Request) -> web.Response:
    return json_response(request.app[_KEY].status())


@web.middleware
async def _refusals(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The agent's refusals as the shared JSON error body."""
    try:
        return await handler(request)
    except RefusedError as exc:
        raise RequestError(exc.code, exc.detail, exc.status) from exc


def _not_installed(reason: str, *roles: str) -> Handler:
    @allow(*roles)
    async def handler(request: web.Request) -> web.Response:
        raise RequestError("extra_not_installed", reason, 501)

    return handler


def _add_abe_routes(app: web.Application, agent: Agent) -> None:
    """The CP-ABE routes; without the ``abe`` extra each answers 501."""
    try:
        extras.require("abe", "policy-sealed data (CP-ABE)")
    except extras.MissingExtraError as exc:
        reason = str(exc)
        app.router.add_post("/v1/keys/abe", _not_installed(reason, "verifier"))
        app.router.add_post("/v1/sealed", _not_installed(reason, "tenant"))
        app.router.add_get("/v1/abe", _not_installed(reason, "tenant", "verifier"))
        return
    from node_agent.abe import add_abe_routes

    add_abe_routes(app, agent)


def make_app(
    agent: Agent,
    roles: Mapping[str, Collection[str]] | None = None,
    evidence: EvidenceReader | None = None,
) -> web.Application:
    """The node agent's aiohttp application (TLS is up to the site).

    Args:
        agent: the agent.
        roles: role (``tenant``, ``verifier``) -> client certificate common
            names; None disables the check (tests without TLS).
        evidence: where IMA and firmware logs are read (default: the
            kernel's securityfs files).
    """
    middlewares = [error_middleware, _refusals]
    if roles is not None:
        middlewares.append(authz_middleware(roles))
    app = web.Application(middlewares=middlewares, client_max_size=_CLIENT_MAX_SIZE)
    app[_KEY] = agent
    app[_EVIDENCE] = evidence or EvidenceReader()
    app[_TENANTS] = frozenset(roles.get("tenant", ())) if roles is not None else None
    app.router.add_get("/v1/quote", _quote)
    app.router.add_post("/v1/keys/u", _keys_u)
    app.router.add_post("/v1/keys/v", _keys_v)
    app.router.add_get("/v1/status", _status)
    _add_abe_routes(app, agent)
    openapi.add_route(app, "trusted-cloud node agent", api_schemas.AGENT)
    return app
