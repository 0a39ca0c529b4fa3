"""Keystone tokens on the aiohttp APIs: an adapter around keystonemiddleware.

keystonemiddleware's ``auth_token`` is WSGI middleware, and our APIs are
aiohttp applications. Rather than re-implementing token validation, the
adapter runs the real ``AuthProtocol`` (configured from
``[keystone_authtoken]``, with its token cache, revocation checks and
service-token handling) around a tiny inner WSGI application, on a worker
thread: the request's ``X-Auth-Token`` (and ``X-Service-Token``) go in as
a WSGI environ, and the identity headers ``auth_token`` adds
(``X-Identity-Status``, ``X-Project-Id``, ``X-Roles``, ...) come out as an
:class:`oslo_context.context.RequestContext`. Only the token headers of the
client's request are passed in, so a client cannot forge identity headers.

``delay_auth_decision`` is forced off: ``auth_token`` itself refuses a
bad token (401) or answers 503 when it cannot ask Keystone; the adapter
reads that status and the API answers with its own JSON body (``401
unauthorized`` with ``WWW-Authenticate``, or ``503 auth_unavailable``).

A Keystone that accepts connections and never answers would hold each
request for ever with keystonemiddleware's own defaults (no timeout):
:data:`MIDDLEWARE_DEFAULTS` gives each request to Keystone
``http_connect_timeout`` seconds and ``http_request_max_retries`` more
tries, so that a hung Keystone answers ``503 auth_unavailable`` within
about (retries + 1) x timeout seconds (21 s with the defaults; half a
second between the tries).
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from keystoneauth1 import exceptions as ks_exceptions
from keystonemiddleware import auth_token
from oslo_config import cfg
from oslo_context import context

from verifier.common import conventions
from verifier.exceptions import ConfigError, RequestError, VerifierError

__all__ = [
    "MIDDLEWARE_DEFAULTS",
    "KeystoneAuthenticator",
    "KeystoneContext",
    "register_opts",
    "set_middleware_defaults",
]

_TOKEN_HEADERS = {"X-Auth-Token": "HTTP_X_AUTH_TOKEN",
                  "X-Service-Token": "HTTP_X_SERVICE_TOKEN"}  # fmt: skip
_StartResponse = Callable[..., Any]
LOG = logging.getLogger(__name__)


#: Our defaults for keystonemiddleware's options (``[keystone_authtoken]``):
#: seconds for each request to Keystone (its own default: none, wait for
#: ever) and how many more tries a request that times out gets.
MIDDLEWARE_DEFAULTS: dict[str, int] = {
    "http_connect_timeout": 10,
    "http_request_max_retries": 1,
}
_GROUP = "keystone_authtoken"


def register_opts(conf: cfg.ConfigOpts) -> None:
    """Register ``[keystone_authtoken]`` (and the auth plugin's options)
    on ``conf`` as keystonemiddleware does for its services, with
    :data:`MIDDLEWARE_DEFAULTS`."""
    for group, opts in auth_token.list_opts():
        conf.register_opts(opts, group=group)
    for name, value in MIDDLEWARE_DEFAULTS.items():
        conf.set_default(name, value, group=_GROUP)


def set_middleware_defaults() -> None:
    """:data:`MIDDLEWARE_DEFAULTS` on keystonemiddleware's own option
    objects: the ``oslo.config.opts.defaults`` hook, so that the sample
    configurations that ``oslo-config-generator`` writes show them."""
    from keystonemiddleware.auth_token import _opts

    cfg.set_defaults(_opts._OPTS, **MIDDLEWARE_DEFAULTS)


class _KeystoneUnavailableError(VerifierError):
    """auth_token answered 503: it could not ask Keystone."""


class KeystoneContext(context.RequestContext):
    """A token's context plus the service catalog that came with it."""

    service_catalog: list[dict[str, Any]] = []


def _catalog(environ: Mapping[str, Any]) -> list[dict[str, Any]]:
    try:
        data = json.loads(environ.get("HTTP_X_SERVICE_CATALOG") or "[]")
    except ValueError:
        return []
    return [s for s in data if isinstance(s, dict)] if isinstance(data, list) else []


def _inner(environ: dict[str, Any], start_response: _StartResponse) -> Iterable[bytes]:
    environ["trusted_cloud.reached"] = True
    start_response("204 No Content", [])
    return [b""]


def _check_token_cache(group: Any) -> None:
    """A shared token cache whose client library is not installed fails
    every request (HTTP 500, keystonemiddleware imports it at the first
    token): a configuration error at start instead.

    Raises:
        ConfigError: ``memcached_servers`` is set and the module that
            keystonemiddleware needs for it is not installed.
    """
    if not group.memcached_servers:
        return
    if group.memcache_sasl_enabled:
        needed = {"bmemcached": "python-binary-memcached"}
    else:
        needed = {"memcache": "python-memcached"}
        if group.memcache_use_advanced_pool:
            needed["oslo_cache"] = "oslo.cache"
    for module, package in needed.items():
        if importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"[keystone_authtoken] memcached_servers needs the {package} "
                f"package, which is not installed (pip install {package}), "
                "or leave memcached_servers unset for the in-process token "
                "cache"
            )


class KeystoneAuthenticator:
    """Validates Keystone tokens with keystonemiddleware's ``auth_token``.

    Args:
        conf: the service configuration with ``[keystone_authtoken]``.

    Raises:
        ConfigError: ``memcached_servers`` without its client library.
    """

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        register_opts(conf)
        _check_token_cache(conf.keystone_authtoken)
        self._middleware = auth_token.AuthProtocol(
            _inner, {"oslo_config_config": conf, "delay_auth_decision": False}
        )
        self.www_authenticate = _www_authenticate(conf)

    def validate(self, headers: Mapping[str, str]) -> context.RequestContext | None:
        """The caller's context from the token headers (blocking: call on a
        worker thread), or None if there is no valid token.

        Raises:
            _KeystoneUnavailableError: Keystone could not be asked.
        """
        environ: dict[str, Any] = {
            "REQUEST_METHOD": "GET",
            "PATH_INFO": "/",
            "SERVER_NAME": "localhost",
            "SERVER_PORT": "443",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "wsgi.url_scheme": "https",
            "wsgi.input": io.BytesIO(),
            "wsgi.errors": io.StringIO(),
        }
        request_id = conventions.current_request_id()
        if request_id is not None:  # the context's id is the request's
            environ["openstack.request_id"] = request_id
        for header, key in _TOKEN_HEADERS.items():
            value = headers.get(header)
            if value:
                environ[key] = value
        if "HTTP_X_AUTH_TOKEN" not in environ:
            return None
        statuses: list[str] = []
        for _ in self._middleware(environ, lambda status, *a: statuses.append(status)):
            pass
        if not environ.get("trusted_cloud.reached"):
            if statuses and statuses[0].startswith("503"):
                raise _KeystoneUnavailableError()
            return None
        if environ.get("HTTP_X_IDENTITY_STATUS") != "Confirmed":
            return None
        ctx = KeystoneContext.from_environ(environ)
        ctx.service_catalog = _catalog(environ)
        return ctx

    async def authenticate(
        self, headers: Mapping[str, str]
    ) -> context.RequestContext | None:
        """:meth:`validate` on a worker thread (a cached token costs no
        round trip to Keystone; an unknown one costs one).

        Raises:
            RequestError: ``auth_unavailable`` (503) when Keystone cannot
                be asked (down, or misconfigured): fail closed.
        """
        try:
            return await asyncio.to_thread(self.validate, headers)
        except (ks_exceptions.ClientException, _KeystoneUnavailableError) as exc:
            LOG.error("Cannot validate tokens with Keystone: %s", type(exc).__name__)
            raise RequestError(
                "auth_unavailable", "the identity service cannot be reached", 503
            ) from None


def _www_authenticate(conf: cfg.ConfigOpts) -> str:
    group = conf.keystone_authtoken
    uri = group.www_authenticate_uri or ""
    return f'Keystone uri="{uri}"'
