"""The verifier's compute host API (trusted compute pools, issue 29):
the operator's (admin or service) only; hosts belong to no project.

``POST /v1/hosts``               enrol a host: ``HostEnrolmentRequest``
                                 (:mod:`verifier.protocol.messages.hosts`)
``GET /v1/hosts``                list, with each host's verdict
``GET /v1/hosts/{host}``         one (provider UUID or hypervisor host
                                 name), with its guests
``DELETE /v1/hosts/{host}``      stop attesting it (its trait goes)
``PUT /v1/nodes/{uuid}/host``    the Nova listener: the compute host an
                                 enrolled node's instance runs on now
                                 (``{"host": name}``)
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from verifier.api.authz import caller, rule
from verifier.attest.host_batches import HostBatches
from verifier.attest.host_store import HostStore
from verifier.attest.hosts import HostCommands
from verifier.common.web import json_response, read_json
from verifier.exceptions import NotFoundError
from verifier.protocol import canonical_uuid
from verifier.protocol.messages._fields import Reader, check_host
from verifier.protocol.messages.hosts import HostEnrolmentRequest

__all__ = ["add_routes"]

_HOSTS = web.AppKey("hosts", HostCommands)
_STORE = web.AppKey("host_store", HostStore)
_BATCHES = web.AppKey("host_batches", HostBatches)


@rule("attestation:host:create")
async def _enrol(request: web.Request) -> web.Response:
    body = HostEnrolmentRequest.from_dict(await read_json(request))
    project = caller(request).project or ""  # whose stored policies are named
    view = await request.app[_HOSTS].enrol(body, project)
    return json_response(view.to_dict(), status=201)


@rule("attestation:host:list")
async def _list(request: web.Request) -> web.Response:
    views = await request.app[_HOSTS].list()
    return json_response({"hosts": [view.to_dict() for view in views]})


@rule("attestation:host:get")
async def _get(request: web.Request) -> web.Response:
    view = await request.app[_HOSTS].get(request.match_info["host"])
    return json_response(view.to_dict())


@rule("attestation:host:delete")
async def _delete(request: web.Request) -> web.Response:
    await request.app[_HOSTS].delete(request.match_info["host"])
    return web.Response(status=204)


@rule("attestation:host:place")
async def _place(request: web.Request) -> web.Response:
    uuid = canonical_uuid(request.match_info["uuid"])
    r = Reader(await read_json(request), "node placement")
    name = r.get("host")
    r.finish()
    check_host("node placement", "host", name)
    assert isinstance(name, str)
    if not await asyncio.to_thread(request.app[_STORE].place, uuid, name):
        raise NotFoundError("unknown_node", f"node {uuid} is not enrolled")
    request.app[_BATCHES].placed(uuid, name)
    return json_response({"uuid": uuid, "host": name})


def add_routes(
    app: web.Application,
    hosts: HostCommands,
    store: HostStore,
    batches: HostBatches,
) -> None:
    app[_HOSTS] = hosts
    app[_STORE] = store
    app[_BATCHES] = batches
    app.router.add_post("/v1/hosts", _enrol)
    app.router.add_get("/v1/hosts", _list)
    app.router.add_get("/v1/hosts/{host}", _get)
    app.router.add_delete("/v1/hosts/{host}", _delete)
    app.router.add_put("/v1/nodes/{uuid}/host", _place)
