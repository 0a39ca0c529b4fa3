"""The node agent's REST API (aiohttp, served over HTTPS with client certs).

``GET  /v1/quote?nonce=<hex>&pcrs=16,17&csr=0|1``   a quote bound to NK (+CSR)
     ``&ima_from=N&mb=0|1``  plus IMA entries from N / the firmware log
``POST /v1/keys/u``  ``{"u": b64, "payload": b64, "payload_id"?: uuid}``
                     the tenant's share
``POST /v1/keys/v``  ``{"v": b64, "identity_cert": PEM|null}``  the verifier's
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
from verifier.common import extras
from verifier.common.errors import RequestError
from verifier.common.web import (
    Handler,
    allow,
    authz_middleware,
    b64_field,
    error_middleware,
    json_response,
    read_json,
)
from verifier.protocol.envelope import MAX_PAYLOAD_BYTES, canonical_uuid

__all__ = ["make_app"]

_KEY = web.AppKey("agent", Agent)
_EVIDENCE = web.AppKey("evidence", EvidenceReader)
_NONCE_MIN, _NONCE_MAX = 8, 32
_MAX_PCRS = 24
#: A payload envelope is the payload plus 32 bytes; base64 grows it by 4/3.
_PAYLOAD_ENVELOPE_MAX = MAX_PAYLOAD_BYTES + 64
_CLIENT_MAX_SIZE = (_PAYLOAD_ENVELOPE_MAX * 4) // 3 + 64 * 1024
_SHARE_MAX = 1024
_CERT_MAX = 16384


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
    data = await read_json(request)
    u = b64_field(data, "u", max_len=_SHARE_MAX) or b""
    payload = b64_field(data, "payload", max_len=_PAYLOAD_ENVELOPE_MAX) or b""
    payload_id = data.get("payload_id")
    if payload_id is not None:
        if not isinstance(payload_id, str):
            raise RequestError("bad_field", "'payload_id' must be a UUID string")
        payload_id = canonical_uuid(payload_id)
    agent = request.app[_KEY]
    done = await agent.receive_u(u, payload, payload_id)
    return json_response({"accepted": "u", "bootstrapped": done})


@allow("verifier")
async def _keys_v(request: web.Request) -> web.Response:
    data = await read_json(request)
    v = b64_field(data, "v", max_len=_SHARE_MAX) or b""
    cert = data.get("identity_cert")
    if cert is not None and (not isinstance(cert, str) or len(cert) > _CERT_MAX):
        raise RequestError("bad_field", "'identity_cert' must be a PEM string or null")
    agent = request.app[_KEY]
    done = await agent.receive_v(v, cert.encode() if cert is not None else None)
    return json_response({"accepted": "v", "bootstrapped": done})


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
    app.router.add_get("/v1/quote", _quote)
    app.router.add_post("/v1/keys/u", _keys_u)
    app.router.add_post("/v1/keys/v", _keys_v)
    app.router.add_get("/v1/status", _status)
    _add_abe_routes(app, agent)
    return app
