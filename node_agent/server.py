"""The node agent's REST API (aiohttp, served over HTTPS with client certs).

``GET  /v1/quote?nonce=<hex>&pcrs=16,17&csr=0|1``   a quote bound to NK (+CSR)
     ``&ima_from=N&mb=0|1``  plus IMA entries from N / the firmware log
``POST /v1/keys/u``  ``{"u": b64, "payload": b64, "payload_id"?: uuid}``
                     the tenant's share (``ShareU``)
``POST /v1/keys/v``  ``{"v": b64, "identity_cert": PEM|null}``  the verifier's
                     (``ShareV``; both in :mod:`verifier.protocol.messages.shares`)
``GET  /v1/status``  bootstrap state

Policy-sealed data (CP-ABE keys, ``/v1/sealed``): :mod:`node_agent.abe`.

Errors are JSON ``{"error": {"code", "message"}}`` (see :mod:`verifier.common.web`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping

from aiohttp import web

from node_agent.abe import add_abe_routes
from node_agent.agent import Agent
from node_agent.evidence import EvidenceReader
from node_agent.exceptions import RefusedError, TpmError
from verifier.common.errors import RequestError
from verifier.common.web import (
    Handler,
    allow,
    authz_middleware,
    error_middleware,
    json_response,
    read_json,
)
from verifier.protocol.messages.shares import (
    MAX_PAYLOAD_ENVELOPE,
    ShareAccepted,
    ShareU,
    ShareV,
)

__all__ = ["make_app"]

_KEY = web.AppKey("agent", Agent)
_EVIDENCE = web.AppKey("evidence", EvidenceReader)
_NONCE_MIN, _NONCE_MAX = 8, 32
_MAX_PCRS = 24
#: The largest body: a payload envelope in base64 (4/3) and room for the rest.
_CLIENT_MAX_SIZE = (MAX_PAYLOAD_ENVELOPE * 4) // 3 + 64 * 1024


def _parse_nonce(text: str | None) -> bytes:
    if not text:
        raise RequestError("bad_nonce", "'nonce' is required (hex)")
    try:
        nonce = bytes.fromhex(text)
    except ValueError:
        raise RequestError("bad_nonce", "'nonce' is not hex")
    if not _NONCE_MIN <= len(nonce) <= _NONCE_MAX:
        raise RequestError(
            "bad_nonce",
            f"'nonce' must be {_NONCE_MIN}..{_NONCE_MAX} bytes, got {len(nonce)}",
        )
    return nonce


def _parse_pcrs(text: str | None) -> list[int]:
    if not text:
        raise RequestError("bad_pcrs", "'pcrs' is required (e.g. pcrs=16,17)")
    items = text.split(",")
    if len(items) > _MAX_PCRS:
        raise RequestError("bad_pcrs", f"'pcrs' lists more than {_MAX_PCRS} PCRs")
    pcrs: set[int] = set()
    for item in items:
        item = item.strip()
        if not (item.isascii() and item.isdigit()) or not 0 <= int(item) < 24:
            raise RequestError("bad_pcrs", f"'pcrs': {item!r} is not a PCR index 0..23")
        pcrs.add(int(item))
    return sorted(pcrs)


def _parse_flag(text: str | None, name: str) -> bool:
    if text in (None, "", "0"):
        return False
    if text == "1":
        return True
    raise RequestError(f"bad_{name}", f"'{name}' must be 0 or 1")


@allow("tenant", "verifier")
async def _quote(request: web.Request) -> web.Response:
    query = request.query
    nonce = _parse_nonce(query.get("nonce"))
    pcrs = _parse_pcrs(query.get("pcrs"))
    with_csr = _parse_flag(query.get("csr"), "csr")
    ima_from = _parse_index(query.get("ima_from"))
    with_mb = _parse_flag(query.get("mb"), "mb")
    try:
        result = await request.app[_KEY].quote(nonce, pcrs, with_csr)
    except TpmError as exc:
        raise RequestError("tpm_error", str(exc), 503)
    if ima_from is not None or with_mb:  # read after the quote: a superset
        reader = request.app[_EVIDENCE]
        await asyncio.to_thread(reader.add_to, result, ima_from, with_mb)
    return json_response(result)


def _parse_index(text: str | None) -> int | None:
    if text is None:
        return None
    if not (text.isascii() and text.isdigit()) or len(text) > 12:
        raise RequestError("bad_ima_from", "'ima_from' must be an entry index")
    return int(text)


@allow("tenant")
async def _keys_u(request: web.Request) -> web.Response:
    body = ShareU.from_dict(await read_json(request))
    agent = request.app[_KEY]
    done = await agent.receive_u(body.u, body.payload, body.payload_id)
    return json_response(ShareAccepted("u", done).to_dict())


@allow("verifier")
async def _keys_v(request: web.Request) -> web.Response:
    body = ShareV.from_dict(await read_json(request))
    cert = body.identity_cert
    agent = request.app[_KEY]
    done = await agent.receive_v(body.v, cert.encode() if cert is not None else None)
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
    app.router.add_get("/v1/quote", _quote)
    app.router.add_post("/v1/keys/u", _keys_u)
    app.router.add_post("/v1/keys/v", _keys_v)
    app.router.add_get("/v1/status", _status)
    add_abe_routes(app, agent)
    return app
