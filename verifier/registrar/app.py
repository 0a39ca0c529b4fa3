"""The registrar's REST API (aiohttp, served over mTLS).

``POST /v1/agents/{uuid}``            register EK (+cert), AK -> challenge
``POST /v1/agents/{uuid}/activate``   prove the credential -> activated
``GET /v1/agents``, ``GET|DELETE /v1/agents/{uuid}``
``PUT|GET|DELETE /v1/agents/{uuid}/ek``  the provider's vTPM EK (role provider)
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping

from aiohttp import web

from verifier.common.web import (
    allow,
    authz_middleware,
    b64,
    b64_field,
    error_middleware,
    json_response,
    peer_common_name,
    read_json,
    str_field,
)
from verifier.exceptions import RequestError
from verifier.registrar.service import AgentRecord, Registrar, Registration

_KEY = web.AppKey("registrar", Registrar)


def _record_dict(rec: AgentRecord) -> dict[str, object]:
    return {
        "uuid": rec.uuid,
        "ek_public": b64(rec.ek_public),
        "ek_certificate": b64(rec.ek_certificate) if rec.ek_certificate else None,
        "ak_public": b64(rec.ak_public),
        "tls_cert": rec.tls_cert,
        "host": rec.host,
        "port": rec.port,
        "activated": rec.activated,
    }


@allow("agent")
async def _register(request: web.Request) -> web.Response:
    data = await read_json(request)
    port = data.get("port")
    if not isinstance(port, int) or not 0 < port < 65536:
        raise RequestError("bad_field", "'port' must be an integer 1..65535")
    reg = Registration(
        uuid=request.match_info["uuid"],
        ek_public=b64_field(data, "ek_public", max_len=1024) or b"",
        ek_certificate=b64_field(data, "ek_certificate", optional=True, max_len=8192),
        ak_public=b64_field(data, "ak_public", max_len=1024) or b"",
        tls_cert=str_field(data, "tls_cert"),
        host=str_field(data, "host", max_len=255),
        port=port,
    )
    registrar = request.app[_KEY]
    challenge = await asyncio.to_thread(registrar.register, reg)
    return json_response(
        {
            "credential_blob": b64(challenge.credential_blob),
            "encrypted_secret": b64(challenge.encrypted_secret),
        }
    )


@allow("agent")
async def _activate(request: web.Request) -> web.Response:
    data = await read_json(request)
    credential = b64_field(data, "credential", max_len=64) or b""
    await asyncio.to_thread(
        request.app[_KEY].activate, request.match_info["uuid"], credential
    )
    return json_response({"uuid": request.match_info["uuid"], "activated": True})


@allow("reader")
async def _get(request: web.Request) -> web.Response:
    rec = request.app[_KEY].get(request.match_info["uuid"])
    return json_response(_record_dict(rec))


@allow("reader")
async def _list(request: web.Request) -> web.Response:
    records = request.app[_KEY].list()
    return json_response(
        {"agents": [{"uuid": r.uuid, "activated": r.activated} for r in records]}
    )


@allow("admin")
async def _delete(request: web.Request) -> web.Response:
    request.app[_KEY].delete(request.match_info["uuid"])
    return web.Response(status=204)


@allow("provider")
async def _put_provider_ek(request: web.Request) -> web.Response:
    data = await read_json(request)
    uuid = request.match_info["uuid"]
    created = await asyncio.to_thread(
        request.app[_KEY].register_provider_ek,
        uuid,
        b64_field(data, "ek_public", max_len=1024) or b"",
        b64_field(data, "ek_certificate", optional=True, max_len=8192),
        peer_common_name(request) or "anonymous",
    )
    return json_response(
        {"uuid": uuid, "registered": True, "created": created},
        status=201 if created else 200,
    )


@allow("provider", "reader")
async def _get_provider_ek(request: web.Request) -> web.Response:
    rec = request.app[_KEY].get_provider_ek(request.match_info["uuid"])
    return json_response(
        {
            "uuid": rec.uuid,
            "ek_public": b64(rec.ek_public),
            "ek_certificate": b64(rec.ek_certificate) if rec.ek_certificate else None,
            "provider": rec.provider,
        }
    )


@allow("provider", "admin")
async def _delete_provider_ek(request: web.Request) -> web.Response:
    request.app[_KEY].delete_provider_ek(request.match_info["uuid"])
    return web.Response(status=204)


def make_app(
    registrar: Registrar, roles: Mapping[str, Collection[str]] | None = None
) -> web.Application:
    """The registrar's aiohttp application.

    Args:
        registrar: the service.
        roles: role (``agent``, ``reader``, ``admin``, ``provider``) ->
            client certificate common names;
            None disables the check (tests without TLS).
    """
    middlewares = [error_middleware]
    if roles is not None:
        middlewares.append(authz_middleware(roles))
    app = web.Application(middlewares=middlewares, client_max_size=64 * 1024)
    app[_KEY] = registrar
    app.router.add_post("/v1/agents/{uuid}", _register)
    app.router.add_post("/v1/agents/{uuid}/activate", _activate)
    app.router.add_get("/v1/agents", _list)
    app.router.add_get("/v1/agents/{uuid}", _get)
    app.router.add_delete("/v1/agents/{uuid}", _delete)
    app.router.add_put("/v1/agents/{uuid}/ek", _put_provider_ek)
    app.router.add_get("/v1/agents/{uuid}/ek", _get_provider_ek)
    app.router.add_delete("/v1/agents/{uuid}/ek", _delete_provider_ek)
    return app
