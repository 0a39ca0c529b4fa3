"""The verifier's policy API: runtime (IMA) and measured-boot policies,
stored once and referenced by name from enrolments.

``POST /v1/policies/{kind}``            store a ``PolicyUpload``
                                        (:mod:`verifier.protocol.messages.policies`)
``GET /v1/policies/{kind}``             list (metadata only)
``GET|DELETE /v1/policies/{kind}/{ref}``  one policy (``name``,
                                        ``name@version`` or digest)
``POST /v1/policies/runtime/{ref}/check``  the dry run of a runtime policy
                                        on live nodes: ``PolicyCheckRequest``
                                        (:mod:`verifier.protocol.messages.policy_check`)
``POST /v1/policies/runtime/check``     the dry run of a runtime policy
                                        document not stored: the same body
                                        with ``"policy"`` (a delta's
                                        ``"base"`` among the caller's
                                        project's policies); size bounded
                                        as an upload

``kind`` is ``runtime`` or ``measured-boot``. A new version of a name
switches the project's nodes that follow that name to it
(:mod:`verifier.attest.following`). Policies can be large (a
whole distribution's allowlist), so uploads have their own size limit
instead of the API's small default.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from verifier.api.authz import caller, rule
from verifier.attest.following import PolicySwitch
from verifier.attest.policies import PolicyStore
from verifier.attest.policy_check import PolicyChecker
from verifier.common.web import json_response, parse_json_body, read_json
from verifier.exceptions import RequestError
from verifier.protocol.messages.policies import PolicyUpload
from verifier.protocol.messages.policy_check import PolicyCheckRequest

__all__ = ["add_routes"]

_STORE = web.AppKey("policies", PolicyStore)
_LIMIT = web.AppKey("policy_max_bytes", int)
_CHECKER = web.AppKey("policy_checker", PolicyChecker)
_SWITCH = web.AppKey("policy_switch", PolicySwitch)


def _too_large(limit: int) -> RequestError:
    return RequestError(
        "policy_too_large", f"policy upload exceeds the limit of {limit} bytes", 413
    )


async def _read_limited(request: web.Request, limit: int) -> bytes:
    """The whole body, read chunk by chunk until its end (one ``read`` of
    the stream returns only what has arrived), refused once it passes
    ``limit`` bytes.

    Raises:
        RequestError: ``policy_too_large`` (413).
    """
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)
    body = bytearray()
    while chunk := await request.content.read(min(limit + 1 - len(body), 1 << 20)):
        body += chunk
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


def _parse_upload(body: bytes) -> PolicyUpload:
    return PolicyUpload.from_dict(parse_json_body(body))


@rule("attestation:policy:create")
async def _add(request: web.Request) -> web.Response:
    owner = caller(request).owner()
    body = await _read_limited(request, request.app[_LIMIT])
    store = request.app[_STORE]
    kind = request.match_info["kind"]

    def work() -> tuple[dict[str, object], bool]:
        upload = _parse_upload(body)
        return store.add(kind, upload.policy, upload.name, upload.signature, owner)

    meta, created = await asyncio.to_thread(work)
    switch = request.app.get(_SWITCH)
    if created and switch is not None:  # the nodes that follow the name
        name = meta["name"]
        assert isinstance(name, str)
        await switch.new_version(kind, owner, name)
    return json_response(meta, status=201 if created else 200)


@rule("attestation:policy:list")
async def _list(request: web.Request) -> web.Response:
    store, scope = request.app[_STORE], caller(request).scope
    rows = await asyncio.to_thread(store.list, request.match_info["kind"], scope)
    return json_response({"policies": rows})


@rule("attestation:policy:get")
async def _get(request: web.Request) -> web.Response:
    store, scope = request.app[_STORE], caller(request).scope
    kind, ref = request.match_info["kind"], request.match_info["ref"]
    return json_response(await asyncio.to_thread(store.get, kind, ref, scope))


@rule("attestation:policy:delete")
async def _delete(request: web.Request) -> web.Response:
    store, scope = request.app[_STORE], caller(request).scope
    kind, ref = request.match_info["kind"], request.match_info["ref"]
    await asyncio.to_thread(store.delete, kind, ref, scope)
    return web.Response(status=204)


@rule("attestation:policy:check")
async def _check(request: web.Request) -> web.Response:
    # the caller's project's policy, judged on the caller's project's nodes
    project = caller(request).owner()
    body = PolicyCheckRequest.from_dict(await read_json(request))
    checker = request.app[_CHECKER]
    report = await checker.check(request.match_info["ref"], project, body)
    return json_response(report.to_dict())


def _parse_candidate(body: bytes) -> tuple[object, PolicyCheckRequest]:
    """The candidate document and the nodes of a
    ``POST /v1/policies/runtime/check`` body.

    Raises:
        RequestError: ``bad_json``, ``bad_field`` (no ``policy``).
        MalformedError: the nodes part, naming the field.
    """
    data = dict(parse_json_body(body))
    if "policy" not in data:
        raise RequestError(
            "bad_field", "'policy' is missing: the runtime policy document to check"
        )
    document = data.pop("policy")
    return document, PolicyCheckRequest.from_dict(data)


@rule("attestation:policy:check")
async def _check_candidate(request: web.Request) -> web.Response:
    # a document nothing stores, judged on the caller's project's nodes
    # (a delta's base among the caller's project's policies)
    project = caller(request).owner()
    body = await _read_limited(request, request.app[_LIMIT])
    document, nodes = await asyncio.to_thread(_parse_candidate, body)
    checker = request.app[_CHECKER]
    report = await checker.check_candidate(document, project, nodes)
    return json_response(report.to_dict())


def add_routes(
    app: web.Application,
    store: PolicyStore,
    max_bytes: int,
    checker: PolicyChecker | None = None,
    switch: PolicySwitch | None = None,
) -> None:
    """Serve the policy API from ``app`` (the dry run with ``checker``);
    ``switch`` moves the nodes that follow a name to its new versions
    (None: nothing follows)."""
    app[_STORE] = store
    app[_LIMIT] = max_bytes
    if checker is not None:
        app[_CHECKER] = checker
        # before the generic routes: "check" is no policy kind or name here
        app.router.add_post("/v1/policies/runtime/check", _check_candidate)
        app.router.add_post("/v1/policies/runtime/{ref}/check", _check)
    if switch is not None:
        app[_SWITCH] = switch
    app.router.add_post("/v1/policies/{kind}", _add)
    app.router.add_get("/v1/policies/{kind}", _list)
    app.router.add_get("/v1/policies/{kind}/{ref}", _get)
    app.router.add_delete("/v1/policies/{kind}/{ref}", _delete)
