"""Policy-sealed data: the verifier publishes its CP-ABE public parameters.

``GET /v1/abe/params``   ``AbeParams`` (:mod:`verifier.protocol.messages.abe`)

Tenants seal to ``(policy) and epoch=<n> and project=<p>`` under these
parameters (``p``: the caller's project, in the answer); nodes
get their keys from the verifier after valid quotes
(:mod:`verifier.attest.abe_keys`). The master key never leaves the
verifier.
"""

from __future__ import annotations

from aiohttp import web

from verifier.api.authz import caller, rule
from verifier.attest.abe_keys import AbeAuthority
from verifier.common.web import json_response

__all__ = ["add_abe_routes"]

_AUTHORITY = web.AppKey("abe_authority", AbeAuthority)


@rule("attestation:abe:params")
async def _params(request: web.Request) -> web.Response:
    project = caller(request).project
    return json_response(request.app[_AUTHORITY].params(project).to_dict())


def add_abe_routes(app: web.Application, authority: AbeAuthority) -> None:
    """Publish ``authority``'s public parameters and epoch."""
    app[_AUTHORITY] = authority
    app.router.add_get("/v1/abe/params", _params)
