"""The OpenAPI 3 contract of a service, generated from its routes.

Every service (registrar, verifier, key service, node agent, revocation
listener) serves ``GET /v1/openapi.json``: its routes, their path
parameters, a JSON object request body on ``POST``/``PUT``, and the
answers every route may give -- a 2xx success, or a 4xx refusal with the
JSON error body (:class:`~verifier.protocol.messages.errors.ErrorBody`).
No 5xx is part of the contract (except where a route declares one, e.g.
the verifier's ``502`` when the registrar cannot be reached): schemathesis
checks the running services against it
(``verifier/tests/functional/test_api_contract.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from aiohttp import web

from verifier.common.api_schemas import Responses
from verifier.common.web import json_response

__all__ = ["ERROR_SCHEMA", "add_route", "document", "document_routes"]

_PARAM = re.compile(r"{(\w+)(?::[^}]*)?}")

#: The JSON error body of every refusal.
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string", "minLength": 1, "maxLength": 128},
                "message": {"type": "string"},
            },
        }
    },
}
_ERROR = {
    "description": "refused: the error code names the problem",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}
_SUCCESS_TYPES = ("application/json", "application/x-pem-file", "text/plain")


def _success(method: str, schema: Mapping[str, Any] | None) -> dict[str, Any]:
    if schema is not None:
        return {
            "description": "success",
            "content": {"application/json": {"schema": dict(schema)}},
        }
    if method == "delete":
        return {"description": "done (no body)"}
    content: dict[str, Any] = {t: {"schema": {}} for t in _SUCCESS_TYPES}
    return {"description": "success", "content": content}


def _operation(
    method: str, handler: Any, path: str, schema: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    method = method.lower()
    name = getattr(handler, "__name__", "handler").strip("_") or "handler"  # summary
    operation: dict[str, Any] = {
        "operationId": method + re.sub(r"[^A-Za-z0-9]+", "_", path),
        "summary": (handler.__doc__ or name).strip().splitlines()[0],
        "parameters": [
            {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
            for p in _PARAM.findall(path)
        ],
        "responses": {"2XX": _success(method, schema), "4XX": _ERROR},
    }
    extra = getattr(handler, "openapi_responses", None)
    if extra:
        operation["responses"].update({str(s): _ERROR for s in extra})
    roles = getattr(handler, "roles", None)
    if roles:
        operation["description"] = "Callers: " + ", ".join(sorted(roles)) + "."
    if method in ("post", "put"):
        operation["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    return operation


def document(
    app: web.Application,
    title: str,
    version: str = "1",
    responses: Responses | None = None,
) -> dict[str, Any]:
    """The OpenAPI 3.0 document of ``app``'s routes.

    Args:
        app: the application, with every route added.
        title: the service's name.
        version: the document's version.
        responses: schemas of success bodies by (METHOD, route path)
            (:mod:`verifier.common.api_schemas`); other routes declare
            any body of their content types.
    """
    routes = []
    for route in app.router.routes():
        info: Mapping[str, Any] = route.resource.get_info() if route.resource else {}
        path = info.get("formatter") or info.get("path")
        if path:
            routes.append((route.method, path, route.handler))
    return document_routes(routes, title, version, responses)


def document_routes(
    routes: Iterable[tuple[str, str, Any]],
    title: str,
    version: str = "1",
    responses: Responses | None = None,
) -> dict[str, Any]:
    """The OpenAPI 3.0 document of ``routes``: (method, path template,
    handler) each (:func:`document` for the arguments)."""
    schemas = responses or {}
    paths: dict[str, dict[str, Any]] = {}
    for method, path, handler in routes:
        if method in ("HEAD", "*"):
            continue
        paths.setdefault(_PARAM.sub(r"{\1}", path), {})[method.lower()] = _operation(
            method, handler, path, schemas.get((method, path))
        )
    return {
        "openapi": "3.0.3",
        "info": {"title": title, "version": version},
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": {"Error": ERROR_SCHEMA}},
    }


def add_route(
    app: web.Application, title: str, responses: Responses | None = None
) -> None:
    """Serve :func:`document` of ``app`` (with the success schemas
    ``responses``) at ``GET /v1/openapi.json`` (built at the first request,
    when every route is there)."""
    built: list[dict[str, Any]] = []

    async def serve(request: web.Request) -> web.Response:
        """The service's OpenAPI 3 document."""
        if not built:
            built.append(document(request.app, title, responses=responses))
        return json_response(built[0])

    app.router.add_get("/v1/openapi.json", serve)
