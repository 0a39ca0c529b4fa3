"""Loading the notifier drivers (the interface, :class:`Notifier`, is in
:mod:`verifier.common.plugins`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import stevedore
from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg

from verifier.common import extras
from verifier.common.plugins import Notifier, NotifierError
from verifier.exceptions import ConfigError

__all__ = ["GROUP", "Notifier", "NotifierError", "load_notifiers"]

GROUP = "verifier.notifiers"


def load_notifiers(
    conf: cfg.ConfigOpts, names: Sequence[str], public_key: ed25519.Ed25519PublicKey
) -> list[Notifier]:
    """Load notifier drivers by name.

    Raises:
        ConfigError: naming an unknown driver or one that cannot start
            (its own configuration error, or the extra it needs).
    """
    missing: list[str] = []

    def _failed(_mgr: object, entrypoint: Any, exc: BaseException) -> None:
        if isinstance(exc, ConfigError):
            raise exc
        raise ConfigError(
            f"notifier {entrypoint.name!r} cannot start: {extras.explain(exc)}"
        ) from exc

    mgr: Any = stevedore.NamedExtensionManager(
        GROUP,
        list(names),
        invoke_on_load=True,
        invoke_args=(conf, public_key),
        on_missing_entrypoints_callback=missing.extend,
        on_load_failure_callback=_failed,
        name_order=True,
    )
    if missing:
        raise ConfigError(f"unknown notifier driver(s): {', '.join(missing)}")
    notifiers: list[Notifier] = [ext.obj for ext in mgr.extensions]
    return notifiers
