"""The notifier plugin interface."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

import stevedore
from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg

from verifier.exceptions import ConfigError, VerifierError

GROUP = "verifier.notifiers"


class NotifierError(VerifierError):
    """A notifier could not deliver an event (it will be retried)."""


class Notifier(abc.ABC):
    """Delivers one signed event to one kind of consumer.

    Args:
        conf: the service configuration.
        public_key: the verifier's event-signing public key.
    """

    name = "base"

    def __init__(self, conf: cfg.ConfigOpts, public_key: ed25519.Ed25519PublicKey):
        self.conf = conf
        self.public_key = public_key

    def deliver(self, event: Mapping[str, Any]) -> bool:
        """Deliver ``event`` (a SignedEvent wire dict).

        Returns:
            True when the consumer acknowledged it.

        Raises:
            NotifierError: on any failure of the driver.
        """
        try:
            return self._deliver(event)
        except NotifierError:
            raise
        except Exception as exc:  # plugin boundary: convert, never leak
            raise NotifierError(f"{self.name}: {exc}") from exc

    @abc.abstractmethod
    def _deliver(self, event: Mapping[str, Any]) -> bool: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections (default: nothing to release)."""


def load_notifiers(
    conf: cfg.ConfigOpts, names: Sequence[str], public_key: ed25519.Ed25519PublicKey
) -> list[Notifier]:
    """Load notifier drivers by name.

    Raises:
        ConfigError: naming an unknown driver or one that cannot start
            (its own configuration error).
    """
    missing: list[str] = []

    def _failed(_mgr: object, entrypoint: Any, exc: BaseException) -> None:
        if isinstance(exc, ConfigError):
            raise exc
        raise ConfigError(f"notifier {entrypoint.name!r} cannot start: {exc}") from exc

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
