"""The verifier's REST API (aiohttp, served over mTLS).

``POST /v1/nodes``                 enrol: ``EnrolmentRequest``
                                   (:mod:`verifier.protocol.messages.enrolment`)
``POST /v1/nodes/batch``           enrol up to 1,000 nodes: ``EnrolmentBatch``,
                                   each node's outcome in the answer
``GET /v1/nodes``                  list
``GET|DELETE /v1/nodes/{uuid}``    status / stop attesting (tenant or operator)
``POST /v1/nodes/{uuid}/instance-created``  Nova created it (operator)
``POST /v1/nodes/{uuid}/revoke``   revoke on the tenant's request
``PUT /v1/nodes/{uuid}/policy``    change the policies in force
                                   (``PolicyChangeRequest``)
``GET /v1/stats``                  counters: nodes per state, quote lag per
                                   class, the outbox's undelivered events
``GET /v1/events``                 the signed events, newest first: filters
                                   and pages (``EventQuery``,
                                   :mod:`verifier.protocol.messages.event_query`)
``GET /v1/signing-key``            the event-signing public key (PEM)
``/v1/nodes/{uuid}/relay/...``     identity quote and U for push nodes
                                   (:mod:`verifier.api.relay_app`)
``/v1/policies/...``               runtime and measured-boot policies, and
                                   the dry run of a runtime policy
                                   (:mod:`verifier.api.policies_app`)
``GET /v1/nodes/{uuid}/history``, ``/v1/log/...``  the attestation log
                                   (:mod:`verifier.api.log_app`)
``/v1/hosts/...``, ``PUT /v1/nodes/{uuid}/host``  compute hosts (the
                                   operator's), a node's current host
                                   (:mod:`verifier.api.hosts_app`)
``POST /v1/nodes/{uuid}/capabilities``  a capability for an attested node
                                   (:mod:`verifier.protocol.messages.capabilities`,
                                   verifier.attest.grants)

Monitor attestation (:mod:`verifier.api.monitor_app`) and CP-ABE key
issuing (:mod:`verifier.api.abe_app`) add their routes when enabled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlencode

from aiohttp import web
from cryptography.hazmat.primitives import serialization

from verifier.api.authz import Auth, auth_middleware, caller, rule
from verifier.api.hosts_app import add_routes as add_host_routes
from verifier.api.log_app import add_routes as add_log_routes
from verifier.api.metrics_app import add_metrics_route
from verifier.api.policies_app import add_routes as add_policy_routes
from verifier.api.relay_app import add_routes as add_relay_routes
from verifier.attest import NodeView, Verifier
from verifier.attest.grants import CapabilityIssuer
from verifier.attest.instances import NovaInstanceOwners
from verifier.common import api_schemas, openapi
from verifier.common.web import error_middleware, json_response, read_json
from verifier.db.busy import database_busy_middleware
from verifier.exceptions import NotFoundError, RequestError
from verifier.protocol import canonical_uuid
from verifier.protocol.messages.capabilities import CapabilityGrant, CapabilityRequest
from verifier.protocol.messages.enrolment import (
    EnrolmentBatch,
    EnrolmentRequest,
    PolicyChangeRequest,
    RevokeRequest,
)
from verifier.protocol.messages.event_query import EventQuery

#: The largest batch enrolment body (1,000 enrolments of a few PCRs each).
MAX_BATCH_BODY = 4 * 1024 * 1024

_KEY = web.AppKey("verifier", Verifier)
_PEM = web.AppKey("signing_pem", str)
_ISSUER = web.AppKey("issuer", CapabilityIssuer)
_INSTANCES = web.AppKey("instances", NovaInstanceOwners)


def _shown(request: web.Request, view: NodeView) -> dict[str, Any]:
    """A node's view as the API answers it: times in ISO 8601, the age of
    its last good quote, and whether it is trusted now."""
    settings = request.app[_KEY].settings
    return view.to_dict(time.time(), settings.trust_window_of(view))


@rule("attestation:node:create")
async def _enrol(request: web.Request) -> web.Response:
    who = caller(request)
    owner = who.owner()
    body = EnrolmentRequest.from_dict(await read_json(request))
    instances = request.app.get(_INSTANCES)
    if instances is not None:  # the instance must be the caller's project's
        await instances.require_owned(body.uuid, owner, who.token, who.catalog)
    verifier = request.app[_KEY]
    view = await verifier.commands.enrol(
        body.uuid,
        body.v,
        body.policy,
        body.runtime_policy,
        body.mb_policy,
        await_instance=body.await_instance,
        project=owner,
        mode=body.mode,
        u_commitment=body.u_commitment,
        interval=body.interval,
    )
    (view,) = await verifier.queries.named([view])
    return json_response(_shown(request, view), status=201)


@rule("attestation:node:create")
async def _enrol_batch(request: web.Request) -> web.Response:
    who = caller(request)
    owner = who.owner()
    batch = EnrolmentBatch.from_dict(await read_json(request, MAX_BATCH_BODY))
    requests = list(batch.nodes)
    refused: dict[int, RequestError] = {}
    instances = request.app.get(_INSTANCES)
    if instances is not None:  # each instance must be the caller's project's
        mine = await instances.owned(who.token, who.catalog)
        for i, body in enumerate(requests):
            if body.uuid not in mine:
                refused[i] = NotFoundError(
                    "unknown_instance", f"no instance {body.uuid} in your project"
                )
    verifier = request.app[_KEY]
    asked = [r for i, r in enumerate(requests) if i not in refused]
    outcomes = iter(await verifier.commands.enrol_many(asked, project=owner))
    results = [refused.get(i) or next(outcomes) for i in range(len(requests))]
    views = await verifier.queries.named(
        [r for r in results if isinstance(r, NodeView)]
    )
    shown = iter(views)
    items = []
    for body, result in zip(requests, results, strict=True):
        if isinstance(result, NodeView):
            items.append(
                {"uuid": body.uuid, "status": 201, "node": _shown(request, next(shown))}
            )
        else:
            error = {"code": result.code, "message": result.detail}
            items.append({"uuid": body.uuid, "status": result.status, "error": error})
    return json_response({"nodes": items})


@rule("attestation:node:list")
async def _list(request: web.Request) -> web.Response:
    views = await request.app[_KEY].queries.list(caller(request).scope)
    return json_response({"nodes": [_shown(request, v) for v in views]})


@rule("attestation:node:get")
async def _get(request: web.Request) -> web.Response:
    uuid, scope = request.match_info["uuid"], caller(request).scope
    view = await request.app[_KEY].queries.get(uuid, scope)
    return json_response(_shown(request, view))


@rule("attestation:node:delete")
async def _delete(request: web.Request) -> web.Response:
    await request.app[_KEY].commands.delete(
        request.match_info["uuid"], caller(request).scope
    )
    return web.Response(status=204)


@rule("attestation:node:instance_created")
async def _instance_created(request: web.Request) -> web.Response:
    uuid = canonical_uuid(request.match_info["uuid"])
    verifier = request.app[_KEY]
    view = await verifier.pending.instance_created(uuid)
    (view,) = await verifier.queries.named([view])
    return json_response(_shown(request, view))


@rule("attestation:node:revoke")
async def _revoke(request: web.Request) -> web.Response:
    scope = caller(request).scope
    data = await read_json(request) if request.can_read_body else {}
    body = RevokeRequest.from_dict(data)
    verifier = request.app[_KEY]
    view = await verifier.commands.revoke(
        request.match_info["uuid"], "tenant_revoked", body.detail, scope
    )
    (view,) = await verifier.queries.named([view])
    return json_response(_shown(request, view))


@rule("attestation:node:set_policy")
async def _set_policy(request: web.Request) -> web.Response:
    scope = caller(request).scope
    body = PolicyChangeRequest.from_dict(await read_json(request))
    view = await request.app[_KEY].commands.set_policy(
        request.match_info["uuid"], body, scope
    )
    return json_response(_shown(request, view))


@rule("attestation:node:stats")
async def _stats(request: web.Request) -> web.Response:
    verifier = request.app[_KEY]
    body = await verifier.queries.stats()
    # the signed events not yet delivered (the dashboard's operator page)
    depth, oldest = await asyncio.to_thread(verifier.outbox.backlog)
    age = None if oldest is None else round(max(0.0, time.time() - oldest), 1)
    body["outbox"] = {"pending": depth, "oldest_pending_age": age}
    return json_response(body)


@rule("attestation:event:list")
async def _events(request: web.Request) -> web.Response:
    scope = caller(request).scope
    query = EventQuery.from_query(request.query)
    page = await asyncio.to_thread(request.app[_KEY].outbox.page, query, scope)
    links = []
    if page.next_marker is not None:
        params = urlencode(query.after(page.next_marker).to_query())
        links.append({"rel": "next", "href": f"/v1/events?{params}"})
    return json_response({"events": page.events, "links": links})


@rule("attestation:node:capability")
async def _capability(request: web.Request) -> web.Response:
    scope = caller(request).scope
    issuer = request.app.get(_ISSUER)
    if issuer is None:
        raise RequestError(
            "not_configured", "capabilities are off ([capabilities] key_file)", 404
        )
    body = CapabilityRequest.from_dict(await read_json(request))
    cap = await issuer.issue(request.match_info["uuid"], body.obj, body.rights, scope)
    grant = CapabilityGrant(cap.to_token(), cap.expiry, cap.epoch)
    return json_response(grant.to_dict(), status=201)


async def _signing_key(request: web.Request) -> web.Response:
    return web.Response(text=request.app[_PEM], content_type="application/x-pem-file")


def make_app(
    verifier: Verifier,
    signing_public_pem: str,
    auth: Auth,
    policy_max_bytes: int = 64 << 20,
    issuer: CapabilityIssuer | None = None,
    routes: Sequence[Callable[[web.Application], None]] = (),
    instances: NovaInstanceOwners | None = None,
) -> web.Application:
    """The verifier's aiohttp application.

    Args:
        verifier: the service.
        signing_public_pem: the event-signing public key (served as is).
        auth: who the callers are and the policy they are held to
            (:mod:`verifier.api.authz`).
        policy_max_bytes: the largest policy upload accepted.
        issuer: issues capabilities to attested nodes (None: off).
        routes: more route sets (monitor attestation, ABE keys), each
            adding itself to the application.
        instances: checks with Nova that an enrolled instance is the
            enrolling project's (None: no check, e.g. without Keystone).
    """
    middlewares = [error_middleware, database_busy_middleware, auth_middleware(auth)]
    app = web.Application(middlewares=middlewares, client_max_size=64 * 1024)
    app[_KEY] = verifier
    app[_PEM] = signing_public_pem
    if issuer is not None:
        app[_ISSUER] = issuer
    if instances is not None:
        app[_INSTANCES] = instances
    app.router.add_post("/v1/nodes", _enrol)
    app.router.add_post("/v1/nodes/batch", _enrol_batch)
    app.router.add_get("/v1/nodes", _list)
    app.router.add_get("/v1/nodes/{uuid}", _get)
    app.router.add_delete("/v1/nodes/{uuid}", _delete)
    app.router.add_post("/v1/nodes/{uuid}/revoke", _revoke)
    app.router.add_put("/v1/nodes/{uuid}/policy", _set_policy)
    app.router.add_post("/v1/nodes/{uuid}/capabilities", _capability)
    app.router.add_post("/v1/nodes/{uuid}/instance-created", _instance_created)
    app.router.add_get("/v1/events", _events)
    app.router.add_get("/v1/stats", _stats)
    app.router.add_get("/v1/signing-key", _signing_key)
    add_metrics_route(app, verifier.gauges.refresh)
    add_policy_routes(
        app, verifier.policies, policy_max_bytes, verifier.checker, verifier.switch
    )
    add_relay_routes(app, verifier.push)
    add_log_routes(app, verifier.log, signing_public_pem)
    add_host_routes(app, verifier.hosts, verifier.host_store, verifier.host_batches)
    for add in routes:
        add(app)
    openapi.add_route(app, "trusted-cloud verifier", api_schemas.VERIFIER)
    return app


def public_pem(key: object) -> str:
    assert hasattr(key, "public_bytes")
    return key.public_bytes(  # type: ignore[no-any-return]
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
