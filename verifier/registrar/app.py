"""The registrar's REST API (aiohttp, served over TLS).

The two agent endpoints accept callers without a client certificate: a
node whose identity is its TPM (its EK certificate must then chain to the
EK anchors, see :meth:`Registrar.register`). Every other endpoint needs a
client certificate in one of its roles (403 ``forbidden`` otherwise).

``POST /v1/agents/{uuid}``            register EK (+cert), AK -> challenge
``POST /v1/agents/{uuid}/activate``   prove the credential -> activated
``GET /v1/agents``, ``GET|DELETE /v1/agents/{uuid}``
``POST /v1/lookup/agents``            the records and placements of up to
                                      1,000 nodes (a batch of enrolments)
``PUT|GET|DELETE /v1/agents/{uuid}/ek``  the provider's vTPM EK (role provider)
``PUT|GET|DELETE /v1/provider/hosts/{host}``  a compute host's vTPM CA
``PUT|GET|DELETE /v1/provider/instances/{uuid}``  where Nova placed an instance
``PUT|GET /v1/hosts/{host}/trust``  a compute host's trust, as the verifier
                                   judged it (role verifier or admin)

With Keystone (``[registrar] auth_strategy = keystone``) tenants read
registrations with their token instead of a reader certificate: the
policy rules ``attestation:registration:get|list`` decide, and a caller
who may not see every project sees only the instances Nova shows its
project (404 ``unknown_instance`` for another's, asked before the
registration is looked up).

The bodies are the classes of :mod:`verifier.protocol.messages.registration`
and :mod:`verifier.protocol.messages.provider`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping

from aiohttp import web

from verifier.api.authz import Auth, keystone_caller, rule, tokens_or_certificates
from verifier.api.metrics_app import add_metrics_route
from verifier.attest.instances import NovaInstanceOwners
from verifier.common import api_schemas, metrics, openapi
from verifier.common.web import (
    allow,
    authz_middleware,
    error_middleware,
    is_anonymous,
    json_response,
    peer_common_name,
    read_json,
)
from verifier.db.busy import database_busy_middleware
from verifier.exceptions import RequestError, VerifierError
from verifier.protocol import canonical_uuid
from verifier.protocol.errors import MalformedError
from verifier.protocol.messages.host_trust import HostTrustRecord, HostTrustUpdate
from verifier.protocol.messages.provider import (
    HostCaEnrolment,
    InstancePlacement,
    ProviderEkRecord,
    ProviderEkRegistration,
    ProviderEkResult,
)
from verifier.protocol.messages.registration import (
    ActivationChallenge,
    ActivationProof,
    ActivationResult,
    AgentLookup,
    AgentLookupResult,
    RegistrationRecord,
    RegistrationRequest,
)
from verifier.protocol.tpm import TpmPublic
from verifier.registrar.service import AgentRecord, Registrar, Registration

_KEY = web.AppKey("registrar", Registrar)
_INSTANCES = web.AppKey("instances", NovaInstanceOwners)
#: ``[registrar] instance_owner_check = none``: Keystone callers unscoped
_UNSCOPED = web.AppKey("unscoped", bool)


def _record(rec: AgentRecord) -> RegistrationRecord:
    """The wire form of a stored registration.

    Raises:
        VerifierError: the stored row does not make a valid record (written
            by an older, laxer registrar): not the caller's fault, so it is
            logged and answered with a 500, and nothing is served from it.
    """
    try:
        return RegistrationRecord(
            uuid=rec.uuid,
            ek_public=TpmPublic.from_bytes(rec.ek_public),
            ek_certificate=rec.ek_certificate,
            ak_public=TpmPublic.from_bytes(rec.ak_public),
            tls_cert=rec.tls_cert,
            host=rec.host,
            port=rec.port,
            activated=rec.activated,
        )
    except MalformedError as exc:
        raise VerifierError(
            f"the stored registration of node {rec.uuid} is invalid ({exc}); "
            "the node must register again"
        ) from exc


@allow("agent", anonymous=True)
async def _register(request: web.Request) -> web.Response:
    body = RegistrationRequest.from_dict(await read_json(request))
    reg = Registration(
        uuid=request.match_info["uuid"],
        ek_public=body.ek_public.to_bytes(),
        ek_certificate=body.ek_certificate,
        ak_public=body.ak_public.to_bytes(),
        tls_cert=body.tls_cert,
        host=body.host,
        port=body.port,
    )
    registrar = request.app[_KEY]
    with metrics.counted(metrics.REGISTRATIONS, "accepted", "refused"):
        challenge = await asyncio.to_thread(
            registrar.register, reg, is_anonymous(request)
        )
    answer = ActivationChallenge(challenge.credential_blob, challenge.encrypted_secret)
    return json_response(answer.to_dict())


@allow("agent", anonymous=True)
async def _activate(request: web.Request) -> web.Response:
    proof = ActivationProof.from_dict(await read_json(request))
    uuid = request.match_info["uuid"]
    with metrics.counted(metrics.ACTIVATIONS, "activated", "refused"):
        await asyncio.to_thread(request.app[_KEY].activate, uuid, proof.credential)
    return json_response(ActivationResult(uuid, True).to_dict())


def _owner_check(request: web.Request) -> NovaInstanceOwners | None:
    """The Nova check a Keystone caller limited to its project needs (None:
    a certificate reader, or a caller who sees every project).

    Raises:
        RequestError: ``forbidden`` (403): no Nova check is configured.
    """
    who = keystone_caller(request)
    if who is None or who.scope is None:
        return None
    if request.app[_UNSCOPED]:
        return None
    instances = request.app.get(_INSTANCES)
    if instances is None:
        raise RequestError(
            "forbidden", "no instance-owner check to scope registrations by", 403
        )
    return instances


@allow("reader")
@rule("attestation:registration:get")
async def _get(request: web.Request) -> web.Response:
    uuid = canonical_uuid(request.match_info["uuid"])
    instances = _owner_check(request)
    if instances is not None:
        who = keystone_caller(request)
        assert who is not None and who.scope is not None
        await instances.require_owned(uuid, who.scope, who.token, who.catalog)
    rec = await asyncio.to_thread(request.app[_KEY].get, uuid)
    return json_response(_record(rec).to_dict())


@allow("reader")
@rule("attestation:registration:list")
async def _list(request: web.Request) -> web.Response:
    records = await asyncio.to_thread(request.app[_KEY].list)
    instances = _owner_check(request)
    if instances is not None:
        who = keystone_caller(request)
        assert who is not None
        mine = await instances.owned(who.token, who.catalog)
        records = [r for r in records if r.uuid in mine]
    return json_response(
        {"agents": [{"uuid": r.uuid, "activated": r.activated} for r in records]}
    )


@allow("reader")
@rule("attestation:registration:list")
async def _lookup(request: web.Request) -> web.Response:
    body = AgentLookup.from_dict(await read_json(request))
    records, hosts = await asyncio.to_thread(request.app[_KEY].lookup, body.uuids)
    instances = _owner_check(request)
    if instances is not None:  # a project's caller: its own instances only
        who = keystone_caller(request)
        assert who is not None
        mine = await instances.owned(who.token, who.catalog)
        records = [r for r in records if r.uuid in mine]
        hosts = {u: h for u, h in hosts.items() if u in mine}
    answer = AgentLookupResult(tuple(_record(r) for r in records), hosts)
    return json_response(answer.to_dict())


@allow("admin")
async def _delete(request: web.Request) -> web.Response:
    await asyncio.to_thread(request.app[_KEY].delete, request.match_info["uuid"])
    return web.Response(status=204)


@allow("provider")
async def _put_provider_ek(request: web.Request) -> web.Response:
    body = ProviderEkRegistration.from_dict(await read_json(request))
    uuid = request.match_info["uuid"]
    created = await asyncio.to_thread(
        request.app[_KEY].register_provider_ek,
        uuid,
        body.ek_public.to_bytes(),
        body.ek_certificate,
        peer_common_name(request) or "anonymous",
    )
    answer = ProviderEkResult(uuid, created)
    return json_response(answer.to_dict(), status=201 if created else 200)


@allow("provider", "reader")
async def _get_provider_ek(request: web.Request) -> web.Response:
    rec = await asyncio.to_thread(
        request.app[_KEY].get_provider_ek, request.match_info["uuid"]
    )
    answer = ProviderEkRecord(
        rec.uuid, TpmPublic.from_bytes(rec.ek_public), rec.ek_certificate, rec.provider
    )
    return json_response(answer.to_dict())


@allow("provider", "admin")
async def _delete_provider_ek(request: web.Request) -> web.Response:
    await asyncio.to_thread(
        request.app[_KEY].delete_provider_ek, request.match_info["uuid"]
    )
    return web.Response(status=204)


def _provider(request: web.Request) -> str:
    return peer_common_name(request) or "anonymous"


@allow("provider")
async def _put_host_ca(request: web.Request) -> web.Response:
    body = HostCaEnrolment.from_dict(await read_json(request))
    host = request.match_info["host"]
    created = await asyncio.to_thread(
        request.app[_KEY].hosts.put_host_ca,
        host,
        body.ca_certificate,
        _provider(request),
    )
    answer = {"host": host, "enrolled": True, "created": created}
    return json_response(answer, status=201 if created else 200)


@allow("provider", "reader")
async def _get_host_ca(request: web.Request) -> web.Response:
    rec = await asyncio.to_thread(
        request.app[_KEY].hosts.get_host_ca, request.match_info["host"]
    )
    answer = {"host": rec.host, "ca_certificate": rec.ca_pem, "provider": rec.provider}
    return json_response(answer)


@allow("provider", "admin")
async def _delete_host_ca(request: web.Request) -> web.Response:
    await asyncio.to_thread(
        request.app[_KEY].hosts.delete_host_ca, request.match_info["host"]
    )
    return web.Response(status=204)


@allow("provider")
async def _put_placement(request: web.Request) -> web.Response:
    body = InstancePlacement.from_dict(await read_json(request))
    uuid = request.match_info["uuid"]
    created = await asyncio.to_thread(
        request.app[_KEY].hosts.put_placement, uuid, body.host, _provider(request)
    )
    answer = {"uuid": uuid, "host": body.host, "created": created}
    return json_response(answer, status=201 if created else 200)


@allow("provider", "reader")
async def _get_placement(request: web.Request) -> web.Response:
    uuid = request.match_info["uuid"]
    host, origin = await asyncio.to_thread(request.app[_KEY].hosts.get_placement, uuid)
    return json_response({"uuid": uuid, "host": host, "origin_host": origin})


@allow("provider", "admin")
async def _delete_placement(request: web.Request) -> web.Response:
    await asyncio.to_thread(
        request.app[_KEY].hosts.delete_placement, request.match_info["uuid"]
    )
    return web.Response(status=204)


@allow("verifier", "admin")
async def _put_host_trust(request: web.Request) -> web.Response:
    body = HostTrustUpdate.from_dict(await read_json(request))
    host = request.match_info["host"]
    held, applied = await asyncio.to_thread(
        request.app[_KEY].hosts.put_trust, host, body.trust()
    )
    return json_response(HostTrustRecord(host, held, applied).to_dict())


@allow("verifier", "admin", "provider")
async def _get_host_trust(request: web.Request) -> web.Response:
    host = request.match_info["host"]
    held = await asyncio.to_thread(request.app[_KEY].hosts.get_trust, host)
    return json_response(HostTrustRecord(host, held).to_dict())


def make_app(
    registrar: Registrar,
    roles: Mapping[str, Collection[str]] | None = None,
    auth: Auth | None = None,
    instances: NovaInstanceOwners | None = None,
    *,
    unscoped: bool = False,
) -> web.Application:
    """The registrar's aiohttp application.

    Args:
        registrar: the service.
        roles: role (``agent``, ``reader``, ``admin``, ``provider``,
            ``metrics``, ``verifier``) ->
            client certificate common names;
            None disables the check (tests without TLS).
        auth: Keystone tokens for the read side (None: certificates only).
        instances: asks Nova whose an instance is, to scope what a
            Keystone caller reads.
        unscoped: a Keystone caller reads every registration
            (``instance_owner_check = none``: no Nova to ask).
    """
    certificates = authz_middleware(roles) if roles is not None else None
    middlewares = [
        error_middleware,
        database_busy_middleware,
        tokens_or_certificates(auth, certificates),
    ]
    app = web.Application(middlewares=middlewares, client_max_size=64 * 1024)
    app[_KEY] = registrar
    app[_UNSCOPED] = unscoped
    if instances is not None:
        app[_INSTANCES] = instances
    app.router.add_post("/v1/agents/{uuid}", _register)
    app.router.add_post("/v1/agents/{uuid}/activate", _activate)
    app.router.add_get("/v1/agents", _list)
    app.router.add_post("/v1/lookup/agents", _lookup)
    app.router.add_get("/v1/agents/{uuid}", _get)
    app.router.add_delete("/v1/agents/{uuid}", _delete)
    app.router.add_put("/v1/agents/{uuid}/ek", _put_provider_ek)
    app.router.add_get("/v1/agents/{uuid}/ek", _get_provider_ek)
    app.router.add_delete("/v1/agents/{uuid}/ek", _delete_provider_ek)
    hosts = "/v1/provider/hosts/{host}"
    app.router.add_put(hosts, _put_host_ca)
    app.router.add_get(hosts, _get_host_ca)
    app.router.add_delete(hosts, _delete_host_ca)
    placements = "/v1/provider/instances/{uuid}"
    app.router.add_put(placements, _put_placement)
    app.router.add_get(placements, _get_placement)
    app.router.add_delete(placements, _delete_placement)
    app.router.add_put("/v1/hosts/{host}/trust", _put_host_trust)
    app.router.add_get("/v1/hosts/{host}/trust", _get_host_trust)
    add_metrics_route(app, roles=("metrics", "admin"))
    openapi.add_route(app, "trusted-cloud registrar", api_schemas.REGISTRAR)
    return app
