"""The key service's REST API (aiohttp, mTLS).

Capabilities travel in ``Authorization: Capability <token>``; node requests
must come with the node's identity certificate (CN = node UUID).

``PUT  /v1/secrets/{name}``             tenant stores ``{secret (b64)}`` for its
                                        project (Keystone token, or the CN of
                                        its certificate with ``noauth``)
``GET  /v1/secrets/{name}``             node, capability ``r`` on ``secret:{name}``
``POST /v1/groups/{gid}/join``          node, capability ``j`` on ``group:{gid}``
``GET  /v1/groups/{gid}/rekey?since=N`` node: signed rekey messages after N
                                        (of the group of the node's project)
``GET  /v1/filegroups/{fg}/state``      node, capability ``r`` on ``filegroup:{fg}``
``GET  /v1/groups[/{gid}]``             tenant (Keystone token): its project's
``GET  /v1/filegroups[/{fg}]``          groups and filegroups (admin: all;
                                        ``?project=`` picks one for a show)
``POST /v1/revocations``                verifier: one signed revocation event
``GET  /v1/signing-key``                the rekey-message signing key (PEM)
``GET  /v1/stats``                      counters (accepted/rejected by reason)

The bodies are the classes of :mod:`verifier.protocol.messages.keyservice`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from aiohttp import web

from verifier.api.authz import (
    Auth,
    caller,
    keystone_caller,
    rule,
    tokens_or_certificates,
)
from verifier.api.metrics_app import add_metrics_route
from verifier.common import metrics, openapi
from verifier.common.web import (
    allow,
    authz_middleware,
    error_middleware,
    json_response,
    peer_common_name,
    read_json,
)
from verifier.exceptions import RequestError
from verifier.keyservice.service import KeyService
from verifier.protocol.messages.keyservice import (
    FilegroupState,
    RekeyLog,
    SecretRelease,
    SecretUpload,
)

__all__ = ["make_app"]

_KEY = web.AppKey("keyservice", KeyService)
_PEM = web.AppKey("signing_pem", str)
_CHECK_PEER = web.AppKey("check_peer", bool)
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def _name(request: web.Request, field: str) -> str:
    value = request.match_info[field]
    if not _NAME.match(value):
        raise RequestError("bad_name", f"{field} must match [A-Za-z0-9._-]{{1,128}}")
    return value


def _token(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme != "Capability" or not token:
        raise RequestError(
            "capability_missing", "send 'Authorization: Capability <token>'", 401
        )
    return token


def _peer(request: web.Request) -> str | None:
    return peer_common_name(request) if request.app[_CHECK_PEER] else None


@allow("tenant")
@rule("attestation:secret:create")
async def _put_secret(request: web.Request) -> web.Response:
    who = keystone_caller(request)
    # a token's project, or (noauth) the tenant certificate's CN, as the
    # verifier makes it the project of the nodes that tenant enrols
    project = who.owner() if who is not None else (peer_common_name(request) or "")
    upload = SecretUpload.from_dict(await read_json(request))
    request.app[_KEY].put_secret(_name(request, "name"), upload.secret, project)
    return web.Response(status=204)


@allow("node")
async def _get_secret(request: web.Request) -> web.Response:
    svc = request.app[_KEY]
    with metrics.counted(metrics.KEY_RELEASES, "released", "refused", "secret"):
        secret = svc.get_secret(_name(request, "name"), _token(request), _peer(request))
    return json_response(SecretRelease(secret).to_dict())


@allow("node")
async def _join(request: web.Request) -> web.Response:
    svc = request.app[_KEY]
    with metrics.counted(metrics.KEY_RELEASES, "released", "refused", "group"):
        welcome = svc.join(_name(request, "gid"), _token(request), _peer(request))
    return json_response(welcome.to_dict())


@allow("node")
async def _rekey(request: web.Request) -> web.Response:
    try:
        since = int(request.query.get("since", "0"))
    except ValueError:
        raise RequestError("bad_field", "'since' must be an integer")
    svc = request.app[_KEY]
    gid = _name(request, "gid")
    peer = _peer(request)
    messages = svc.rekey_messages(gid, since, peer)
    epoch = svc.group_epoch(gid, peer)
    return json_response(RekeyLog(epoch, tuple(messages)).to_dict())


@allow("node")
async def _filegroup(request: web.Request) -> web.Response:
    svc = request.app[_KEY]
    state = svc.filegroup_state(_name(request, "fg"), _token(request), _peer(request))
    return json_response(FilegroupState.of(state).to_dict())


def _show_project(request: web.Request) -> str:
    """The project whose group or filegroup a caller reads: its own; an
    admin (every project in scope) may name another with ``?project=``."""
    who = caller(request)
    if who.scope is None:
        return request.query.get("project") or who.project or ""
    return who.scope


@rule("attestation:group:list")
async def _list_groups(request: web.Request) -> web.Response:
    groups = request.app[_KEY].groups(caller(request).scope)
    return json_response({"groups": groups})


@rule("attestation:group:get")
async def _show_group(request: web.Request) -> web.Response:
    name, project = _name(request, "gid"), _show_project(request)
    return json_response(request.app[_KEY].find("group", name, project))


@rule("attestation:filegroup:list")
async def _list_filegroups(request: web.Request) -> web.Response:
    filegroups = request.app[_KEY].filegroups(caller(request).scope)
    return json_response({"filegroups": filegroups})


@rule("attestation:filegroup:get")
async def _show_filegroup(request: web.Request) -> web.Response:
    name, project = _name(request, "fg"), _show_project(request)
    return json_response(request.app[_KEY].find("filegroup", name, project))


@allow("verifier")
async def _revocation(request: web.Request) -> web.Response:
    return json_response(request.app[_KEY].revoke(await read_json(request)))


async def _signing_key(request: web.Request) -> web.Response:
    return web.Response(text=request.app[_PEM], content_type="application/x-pem-file")


@allow("tenant", "verifier")
async def _stats(request: web.Request) -> web.Response:
    return json_response(request.app[_KEY].stats())


def make_app(
    service: KeyService,
    signing_public_pem: str,
    roles: Mapping[str, Collection[str]] | None = None,
    auth: Auth | None = None,
) -> web.Application:
    """The key service's aiohttp application.

    Args:
        service: the state and rules.
        signing_public_pem: the rekey-message signing key (served as is).
        roles: ``tenant`` / ``verifier`` / ``metrics`` -> certificate CNs; None disables
            role checks and peer binding (tests without TLS). Node routes
            are open to any authenticated client: the capability, bound to
            the client certificate's CN, decides.
        auth: Keystone tokens for the tenant's ``PUT /v1/secrets`` (None:
            certificates only).
    """
    certificates = None
    if roles is not None:
        members = dict(roles)
        members["node"] = _AnyName()
        certificates = authz_middleware(members)
    middlewares = [error_middleware, tokens_or_certificates(auth, certificates)]
    app = web.Application(middlewares=middlewares, client_max_size=64 * 1024)
    app[_KEY] = service
    app[_PEM] = signing_public_pem
    app[_CHECK_PEER] = roles is not None
    app.router.add_put("/v1/secrets/{name}", _put_secret)
    app.router.add_get("/v1/secrets/{name}", _get_secret)
    app.router.add_post("/v1/groups/{gid}/join", _join)
    app.router.add_get("/v1/groups/{gid}/rekey", _rekey)
    app.router.add_get("/v1/filegroups/{fg}/state", _filegroup)
    app.router.add_get("/v1/groups", _list_groups)
    app.router.add_get("/v1/groups/{gid}", _show_group)
    app.router.add_get("/v1/filegroups", _list_filegroups)
    app.router.add_get("/v1/filegroups/{fg}", _show_filegroup)
    app.router.add_post("/v1/revocations", _revocation)
    app.router.add_get("/v1/signing-key", _signing_key)
    app.router.add_get("/v1/stats", _stats)
    add_metrics_route(app, roles=("metrics",))
    openapi.add_route(app, "trusted-cloud key service")
    return app


class _AnyName(Collection[str]):
    """Every authenticated client may try node routes: the capability and
    its binding to the client certificate's CN decide."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(())

    def __len__(self) -> int:
        return 0
