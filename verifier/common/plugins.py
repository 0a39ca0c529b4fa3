"""The extension points other packages plug into: revocation event
notifiers (stevedore group ``verifier.notifiers``) and Nova instance
lifecycle hooks (``verifier.instance_hooks``).

They live here, in the shared plumbing, so that a plugin of another
package (the revocation hooks' in-process notifier, the vTPM manager's
instance hook) implements a public interface and never imports the
verifier's internals. Loading the drivers is the services' business
(:mod:`verifier.notify.base`, :mod:`verifier.nova_listener.hooks`).

A notifier delivers one signed event to one kind of consumer. An instance
hook is loaded with the listener's configuration (``conf`` keyword), so a
driver registers and reads an option group of its own. It may fail two
ways: :class:`InstanceHookError` is logged and the event is done;
:class:`InstanceHookRetryError` (something worth another try, e.g. a
service is down) makes the listener requeue the event, so it is delivered
again and every step runs again: hooks must therefore be idempotent.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ed25519
from oslo_config import cfg

from verifier.common.errors import CommonError

__all__ = [
    "InstanceHook",
    "InstanceHookError",
    "InstanceHookRetryError",
    "Notifier",
    "NotifierError",
]


class NotifierError(CommonError):
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


class InstanceHookError(CommonError):
    """A hook failed; the listener logs it and goes on."""


class InstanceHookRetryError(InstanceHookError):
    """A hook failed for now; the listener requeues the event."""


class InstanceHook(abc.ABC):
    """Called after the listener handled an instance event.

    Args:
        conf: the listener's configuration (None: a private, empty one).
    """

    def __init__(self, conf: cfg.ConfigOpts | None = None) -> None:
        self.conf = conf if conf is not None else cfg.ConfigOpts()

    def instance_created(self, uuid: str) -> None:
        """Nova finished creating ``uuid`` (``instance.create.end``).

        Raises:
            InstanceHookError: any failure of the hook.
        """
        try:
            self._instance_created(uuid)
        except InstanceHookError:
            raise
        except Exception as exc:  # a plugin boundary: wrap whatever it raised
            raise InstanceHookError(f"{type(self).__name__}: {exc}") from exc

    def instance_deleted(self, uuid: str) -> None:
        """Nova deleted ``uuid`` (``instance.delete.end``).

        Raises:
            InstanceHookRetryError: a failure worth another delivery.
            InstanceHookError: any other failure of the hook.
        """
        try:
            self._instance_deleted(uuid)
        except InstanceHookError:
            raise
        except Exception as exc:  # a plugin boundary: wrap whatever it raised
            raise InstanceHookError(f"{type(self).__name__}: {exc}") from exc

    def instance_placed(self, uuid: str, host: str) -> None:
        """Nova runs ``uuid`` on compute host ``host`` now
        (``instance.create.end``, and the ends of resize, cold and live
        migration and their reverts).

        Raises:
            InstanceHookRetryError: a failure worth another delivery.
            InstanceHookError: any other failure of the hook.
        """
        try:
            self._instance_placed(uuid, host)
        except InstanceHookError:
            raise
        except Exception as exc:  # a plugin boundary: wrap whatever it raised
            raise InstanceHookError(f"{type(self).__name__}: {exc}") from exc

    def _instance_placed(self, uuid: str, host: str) -> None:  # noqa: B027
        """Default: nothing (a hook that does not care where instances run)."""

    @abc.abstractmethod
    def _instance_created(self, uuid: str) -> None: ...

    @abc.abstractmethod
    def _instance_deleted(self, uuid: str) -> None: ...
