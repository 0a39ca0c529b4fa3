"""The optional parts of an installation: the extras of ``setup.cfg``.

Each deployable role installs only what it imports (``pip install
'trusted-cloud[agent]'``, ``[client]``, ``[server]``, ``[hooks]``,
``[vtpm]``), and each optional driver has an extra of its own (``[abe]``,
``[messaging]``, ``[scale]``, ``[postgresql]``, ``[mysql]``, ``[tpm]``,
``[vault]``, ``[ipsec]``, ``[limits]``). A feature that needs an extra that is not
installed must say so in one line and name the extra, never end in a
traceback: :func:`require` checks before the feature is used, and
:func:`explain` turns an import failure met while loading a plugin into
that line.

This module imports nothing outside the standard library.
"""

from __future__ import annotations

import importlib
import warnings

from verifier.common.errors import CommonError

__all__ = [
    "DIST",
    "DRIVER_MODULES",
    "ROLE_MODULES",
    "MissingExtraError",
    "explain",
    "extra_for",
    "require",
]

#: The distribution name, as ``pip install`` takes it.
DIST = "trusted-cloud"

#: Optional driver extra -> the importable modules it provides.
DRIVER_MODULES: dict[str, tuple[str, ...]] = {
    "abe": ("pymcl",),
    "messaging": ("oslo_messaging",),
    "scale": ("tooz", "redis"),
    "postgresql": ("psycopg",),
    "mysql": ("pymysql",),
    "tpm": ("tpm2_pytss",),
    "vault": ("hvac",),
    "ipsec": ("vici",),
    "limits": ("oslo_limit",),
}

#: Deployable role extra -> the importable modules it provides (what a
#: console script of that role checks before importing its command,
#: :mod:`verifier.common.launch`).
ROLE_MODULES: dict[str, tuple[str, ...]] = {
    "agent": ("oslo_log", "tpm2_pytss"),
    "client": (
        "keystoneauth1",
        "novaclient",
        "osc_lib",
        "openstackclient",
        "debian",
        "zstandard",
    ),
    "server": (
        "sqlalchemy",
        "alembic",
        "oslo_log",
        "uvloop",
        "keystonemiddleware",
        "keystoneauth1",
        "oslo_policy",
        "prometheus_client",
    ),
    "hooks": ("oslo_log", "uvloop", "prometheus_client"),
    "vtpm": ("libvirt", "tpm2_pytss"),
    "dashboard": (
        "horizon",
        "django",
        "keystoneauth1",
        "novaclient",
        "oslo_policy",
    ),
}

#: Modules of the role extras that a feature of another role may miss.
_ROLE_OF_MODULE: dict[str, str] = {
    "libvirt": "vtpm",
    "sqlalchemy": "server",
    "alembic": "server",
    "keystoneauth1": "client",
    "novaclient": "client",
    "osc_lib": "client",
}


class MissingExtraError(CommonError):
    """A feature needs an extra that is not installed.

    Attributes:
        extra: the extra to install (``abe``, ``messaging``, ...).
        module: the module that could not be imported.
        feature: what needed it (an option, a command, a route).
    """

    def __init__(self, extra: str, module: str, feature: str) -> None:
        super().__init__(
            f"{feature} needs the '{extra}' extra ({module} is not installed): "
            f"pip install '{DIST}[{extra}]'"
        )
        self.extra = extra
        self.module = module
        self.feature = feature


def extra_for(module: str) -> str | None:
    """The extra that installs ``module`` (a dotted name), or None."""
    top = module.partition(".")[0]
    for extra, modules in DRIVER_MODULES.items():
        if top in modules:
            return extra
    return _ROLE_OF_MODULE.get(top)


def _missing(extra: str) -> str | None:
    for module in DRIVER_MODULES[extra]:
        try:
            with warnings.catch_warnings():
                # oslo.messaging loads oslo.service's eventlet backend, and
                # eventlet warns on import in nine lines on stderr (a
                # command's configuration error must stay one line)
                warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
                importlib.import_module(module)
        except ImportError:
            return module
    return None


def require(extra: str, feature: str) -> None:
    """Make sure the driver extra ``extra`` is installed before ``feature``
    uses it.

    Args:
        extra: a key of :data:`DRIVER_MODULES`.
        feature: what needs it, for the message (``"[abe] enabled"``).

    Raises:
        MissingExtraError: one of its modules does not import.
        KeyError: ``extra`` is not a driver extra.
    """
    module = _missing(extra)
    if module is not None:
        raise MissingExtraError(extra, module, feature)


def explain(exc: BaseException) -> str:
    """The one-line text of an error met while loading a driver: for a
    module of an extra that is not installed, the extra to install.

    Args:
        exc: the exception (any; others are returned as ``str(exc)``).
    """
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        extra = extra_for(exc.name)
        if extra is not None:
            return f"{exc.name} is not installed: pip install '{DIST}[{extra}]'"
    return str(exc) or type(exc).__name__
