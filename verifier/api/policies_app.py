"""The verifier's policy API: runtime (IMA) and measured-boot policies,
stored once and referenced by name from enrolments.

``POST /v1/policies/{kind}``            store a ``PolicyUpload``
                                        (:mod:`verifier.protocol.messages.policies`)
``GET /v1/policies/{kind}``             list (metadata only)
``GET|DELETE /v1/policies/{kind}/{ref}``  one policy (``name``,
                                        ``name@version`` or digest)

``kind`` is ``runtime`` or ``measured-boot``. Policies can be large (a
whole distribution's allowlist), so uploads have their own size limit
instead of the API's small default.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from verifier.attest.policies import PolicyStore
from verifier.common.web import allow, json_response
from verifier.exceptions import RequestError
from verifier.protocol.messages.policies import PolicyUpload

__all__ = ["add_routes"]

_STORE = web.AppKey("policies", PolicyStore)
_LIMIT = web.AppKey("policy_max_bytes", int)


async def _read_limited(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise RequestError(
            "policy_too_large",
            f"policy upload of {request.content_length} bytes exceeds the limit "
            f"of {limit} bytes",
            413,
        )
    # StreamReader.read(n) returns what has arrived (up to n bytes), not
    # the whole body: read until the end, or one byte past the limit.
    body = bytearray()
    while len(body) <= limit:
        chunk = await request.content.read(limit + 1 - len(body))
        if not chunk:
            break
        body += chunk
    if len(body) > limit:
        raise RequestError(
            "policy_too_large", f"policy upload exceeds the limit of {limit} bytes", 413
        )
    return bytes(body)


def _parse_upload(body: bytes) -> PolicyUpload:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError("bad_json", f"request body is not valid JSON: {exc}")
    if not isinstance(data, dict):
        raise RequestError("bad_json", "request body must be a JSON object")
    return PolicyUpload.from_dict(data)


@allow("tenant")
async def _add(request: web.Request) -> web.Response:
    body = await _read_limited(request, request.app[_LIMIT])
    store = request.app[_STORE]
    kind = request.match_info["kind"]

    def work() -> tuple[dict[str, object], bool]:
        upload = _parse_upload(body)
        return store.add(kind, upload.policy, upload.name, upload.signature)

    meta, created = await asyncio.to_thread(work)
    return json_response(meta, status=201 if created else 200)


@allow("tenant")
async def _list(request: web.Request) -> web.Response:
    store = request.app[_STORE]
    rows = await asyncio.to_thread(store.list, request.match_info["kind"])
    return json_response({"policies": rows})


@allow("tenant")
async def _get(request: web.Request) -> web.Response:
    store = request.app[_STORE]
    kind, ref = request.match_info["kind"], request.match_info["ref"]
    return json_response(await asyncio.to_thread(store.get, kind, ref))


@allow("tenant")
async def _delete(request: web.Request) -> web.Response:
    store = request.app[_STORE]
    kind, ref = request.match_info["kind"], request.match_info["ref"]
    await asyncio.to_thread(store.delete, kind, ref)
    return web.Response(status=204)


def add_routes(app: web.Application, store: PolicyStore, max_bytes: int) -> None:
    """Serve the policy API from ``app``."""
    app[_STORE] = store
    app[_LIMIT] = max_bytes
    app.router.add_post("/v1/policies/{kind}", _add)
    app.router.add_get("/v1/policies/{kind}", _list)
    app.router.add_get("/v1/policies/{kind}/{ref}", _get)
    app.router.add_delete("/v1/policies/{kind}/{ref}", _delete)
