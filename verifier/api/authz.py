"""Who is calling, and may they: authentication and policy for the APIs.

Every request is identified once, by the first of:

1. a Keystone token (``X-Auth-Token``), validated by keystonemiddleware
   (:mod:`verifier.api.keystone`) when ``[verifier] auth_strategy =
   keystone``: tenants, administrators and Keystone service users;
2. the verified client certificate of a machine identity, by its common
   name: the Nova listener and other provider-side services (``service``
   role), capability and monitor clients. In the ``noauth`` strategy a
   certificate named in ``tenant_clients`` is a tenant too, its CN being
   its project (the demo's embedded deployment; no Keystone).

A request carrying a token that does not validate is refused (401), never
retried as another identity. The handler's policy rule
(:func:`rule`; defaults in :mod:`verifier.policies`) is then enforced with
the caller's project as the target, and ``attestation:all_projects`` says
whether the caller sees every project. The handler receives a
:class:`Caller` and never looks at roles.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

from aiohttp import web
from oslo_context import context
from oslo_policy import policy

from verifier.api.keystone import KeystoneAuthenticator
from verifier.common import conventions
from verifier.common.web import Handler, peer_common_name
from verifier.exceptions import RequestError
from verifier.policies import ALL_PROJECTS

__all__ = [
    "Auth",
    "Caller",
    "PolicyDecisions",
    "auth_middleware",
    "caller",
    "keystone_caller",
    "rule",
    "tokens_or_certificates",
]

#: Machine identities have no project: a target no project id matches.
_NO_PROJECT = "-"
_CALLER = web.RequestKey("caller", object)  # a Caller
_F = TypeVar("_F", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True)
class Caller:
    """The authorized caller, as handlers see it.

    Attributes:
        project: the caller's project: the owner of what it creates (None
            for a machine identity, which owns nothing).
        scope: the project whose resources the caller may see and change,
            or None for every project (``attestation:all_projects``).
        user: the Keystone user id or ``cert:<CN>``, for the logs.
        token: the caller's Keystone token, to act on its behalf (e.g. ask
            Nova whose an instance is); None for certificates.
        catalog: the service catalog that came with the token.
    """

    project: str | None
    scope: str | None
    user: str | None
    token: str | None = dataclasses.field(default=None, repr=False)
    catalog: Sequence[Mapping[str, Any]] = ()

    def owner(self) -> str:
        """The project that will own what the caller creates.

        Raises:
            RequestError: ``no_project`` (403) for a caller without one.
        """
        if not self.project:
            raise RequestError(
                "no_project", "a project-scoped token is needed to own resources", 403
            )
        return self.project


def _frozen(creds: Mapping[str, Any]) -> tuple[tuple[str, Any], ...] | None:
    """``creds`` (a context's policy values) as a key, or None if a value
    is not a string, number, boolean, None or a list of those."""
    items = []
    for key, value in creds.items():
        if isinstance(value, list | tuple | set | frozenset):
            value = tuple(sorted(map(str, value)))
        elif value is not None and not isinstance(value, str | int | float | bool):
            return None
        items.append((key, value))
    return tuple(sorted(items))


class PolicyDecisions:
    """oslo.policy's decisions, each remembered for ``ttl`` seconds.

    Enforcing a rule cost about 2 ms of CPU per call (oslo.policy inspects
    each check's signature on every evaluation; a boot storm's profile put
    two calls per request at a fifth of the verifier's API time). A
    decision depends only on the rule, the target and the caller's policy
    values (roles, project, user, domain, scope: what the token or the
    certificate said), so the same question gets the same answer until the
    rules change; an edit of ``[oslo_policy] policy_file`` takes effect
    within ``ttl`` seconds (oslo.policy itself reloads a changed file on
    the next enforcement after that). At most ``size`` decisions are
    kept (all dropped when full).
    """

    def __init__(
        self,
        enforcer: policy.Enforcer,
        ttl: float = 5.0,
        size: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._enforcer = enforcer
        self._ttl = ttl
        self._size = size
        self._clock = clock
        self._kept: dict[Any, tuple[float, bool]] = {}

    def allowed(
        self, rule: str, target: Mapping[str, Any], ctx: context.RequestContext
    ) -> bool:
        """Whether policy ``rule`` allows the caller ``ctx`` on ``target``."""
        creds = _frozen(ctx.to_policy_values())
        key = None if creds is None else (rule, tuple(sorted(target.items())), creds)
        now = self._clock()
        kept = self._kept.get(key) if key is not None else None
        if kept is not None and kept[0] > now:
            return kept[1]
        allowed = bool(self._enforcer.authorize(rule, target, ctx, do_raise=False))
        if key is not None:
            if len(self._kept) >= self._size:
                self._kept.clear()
            self._kept[key] = (now + self._ttl, allowed)
        return allowed


@dataclasses.dataclass(frozen=True)
class Auth:
    """How an API authenticates its callers.

    Attributes:
        enforcer: the oslo.policy enforcer (defaults in code, overrides in
            ``[oslo_policy] policy_file``).
        keystone: validates tokens (None: the ``noauth`` strategy).
        certificates: client certificate CN -> (project, roles) of the
            machine identities (and, with ``noauth``, the tenants).
        open_without_tls: a request without TLS is a ``noauth`` caller
            with every role (in-process tests without TLS only).
    """

    enforcer: policy.Enforcer
    keystone: KeystoneAuthenticator | None = None
    certificates: Mapping[str, tuple[str | None, tuple[str, ...]]] = dataclasses.field(
        default_factory=dict
    )
    open_without_tls: bool = False
    decisions: PolicyDecisions = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "decisions", PolicyDecisions(self.enforcer))

    @staticmethod
    def certificate_roles(
        tenants: Collection[str], machines: Mapping[str, Collection[str]]
    ) -> dict[str, tuple[str | None, tuple[str, ...]]]:
        """The ``certificates`` map: ``tenants`` (noauth only) each their own
        project with reader and member; ``machines`` role -> CNs."""
        out: dict[str, tuple[str | None, tuple[str, ...]]] = {}
        for role, names in machines.items():
            for name in names:
                _, roles = out.get(name, (None, ()))
                out[name] = (None, (*roles, role))
        for name in tenants:
            _, roles = out.get(name, (None, ()))
            out[name] = (name, (*roles, "reader", "member"))
        return out

    async def identify(self, request: web.Request) -> context.RequestContext | None:
        """The caller's context, or None if it proved no identity. It is
        the current oslo.context context of the request from here on (its
        log lines carry the caller), with the request's id.

        Raises:
            RequestError: ``unauthorized`` (401) for a token that does not
                validate.
        """
        if "X-Auth-Token" in request.headers:
            if self.keystone is None:
                raise RequestError(
                    "unauthorized", "this service does not accept Keystone tokens", 401
                )
            ctx = await self.keystone.authenticate(request.headers)
            if ctx is None:
                raise RequestError("unauthorized", "the token is not valid", 401)
            ctx.update_store()  # made on a worker thread: current here too
            return ctx
        name = peer_common_name(request)
        if name is not None and name in self.certificates:
            project, roles = self.certificates[name]
            return context.RequestContext(
                user_id=f"cert:{name}",
                project_id=project,
                roles=list(roles),
                request_id=conventions.current_request_id(),
            )
        if name is None and self.open_without_tls and request.transport is not None:
            if request.transport.get_extra_info("sslcontext") is None:
                return context.RequestContext(
                    user_id="noauth",
                    project_id="noauth",
                    roles=["admin", "member", "reader"],
                    request_id=conventions.current_request_id(),
                )
        return None


def rule(name: str) -> Callable[[_F], _F]:
    """Guard a handler with the policy rule ``name``."""

    def mark(handler: _F) -> _F:
        handler.policy_rule = name  # type: ignore[attr-defined]
        return handler

    return mark


def caller(request: web.Request) -> Caller:
    """The caller of a guarded handler."""
    found = request.get(_CALLER)
    if not isinstance(found, Caller):  # an unguarded handler asked
        raise RequestError("forbidden", "this operation has no policy rule", 403)
    return found


def keystone_caller(request: web.Request) -> Caller | None:
    """The caller :func:`auth_middleware` authorized, or None when the
    request was let through by certificate (:func:`tokens_or_certificates`)."""
    found = request.get(_CALLER)
    return found if isinstance(found, Caller) else None


def tokens_or_certificates(auth: Auth | None, certificates: Any) -> Any:
    """For a service whose machine identities keep their certificates (the
    registrar): a request with a Keystone token to a handler with a
    :func:`rule` goes through :func:`auth_middleware`; every other one
    through ``certificates`` (the certificate-role middleware, or None).
    A caller with neither a token nor a certificate is refused (401) by
    every handler with a rule or a role, unless the handler takes
    anonymous callers (:func:`verifier.common.web.allow`)."""
    tokens = auth_middleware(auth) if auth is not None else None

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        ruled = getattr(request.match_info.handler, "policy_rule", None)
        if tokens is not None and ruled and "X-Auth-Token" in request.headers:
            return await tokens(request, handler)  # type: ignore[no-any-return]
        roles = getattr(request.match_info.handler, "roles", None)
        anonymous = peer_common_name(request) is None
        if tokens is not None and roles and not ruled and anonymous:
            if "X-Auth-Token" in request.headers:  # a token, where none counts
                raise RequestError(
                    "forbidden", "this operation takes a client certificate", 403
                )
        if ruled and roles is None and anonymous:
            # a rule and no certificate role: only a token gets through
            detail = "authenticate with a Keystone token"
            if auth is not None:
                return _unauthorized(auth, detail)
            raise RequestError("unauthorized", detail, 401)
        if certificates is not None:
            return await certificates(request, handler)  # type: ignore[no-any-return]
        return await handler(request)

    return middleware


def _unauthorized(auth: Auth, detail: str) -> web.Response:
    headers = {}
    if auth.keystone is not None:
        headers["WWW-Authenticate"] = auth.keystone.www_authenticate
    body = {"error": {"code": "unauthorized", "message": detail}}
    return web.json_response(body, status=401, headers=headers)


def auth_middleware(auth: Auth) -> Any:
    """Identify the caller and enforce the handler's rule (401/403)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        name = getattr(request.match_info.handler, "policy_rule", None)
        if name is None:  # public (the signing key) or a 404/405 route
            return await handler(request)
        try:
            ctx = await auth.identify(request)
        except RequestError as exc:
            if exc.status != 401:
                raise
            return _unauthorized(auth, exc.detail)
        if ctx is None:
            return _unauthorized(auth, "authenticate with a Keystone token")
        target = {"project_id": ctx.project_id or _NO_PROJECT}
        if not auth.decisions.allowed(name, target, ctx):
            raise RequestError(
                "forbidden", f"policy does not allow {name} to this caller", 403
            )
        everything = auth.decisions.allowed(ALL_PROJECTS, target, ctx)
        request[_CALLER] = Caller(
            ctx.project_id,
            None if everything else (ctx.project_id or _NO_PROJECT),
            ctx.user_id,
            ctx.auth_token,
            getattr(ctx, "service_catalog", ()),
        )
        return await handler(request)

    return middleware
