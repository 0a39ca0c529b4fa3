"""Instance lifecycle hooks of the Nova notification listener.

Stevedore group ``verifier.instance_hooks``. The verifier's own reaction
(mark the node's instance created, unenrol it) is built into the listener;
hooks are for other provider-side parts: the vTPM manager plugs in here
(driver ``vtpm``, :mod:`vtpm_manager.instance_hook`: on ``instance_deleted``
it drops the instance's provider EK registration at the registrar).

A hook is loaded with the listener's configuration (``conf`` keyword), so a
driver registers and reads an option group of its own. It may fail two ways:
:class:`InstanceHookError` is logged and the event is done;
:class:`InstanceHookRetryError` (something worth another try, e.g. a service is
down) makes the listener requeue the event, so it is delivered again and
every step runs again: hooks must therefore be idempotent.
"""

from __future__ import annotations

import abc

from oslo_config import cfg

__all__ = ["InstanceHook", "InstanceHookError", "InstanceHookRetryError", "NoopHook"]


class InstanceHookError(Exception):
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

    @abc.abstractmethod
    def _instance_created(self, uuid: str) -> None: ...

    @abc.abstractmethod
    def _instance_deleted(self, uuid: str) -> None: ...


class NoopHook(InstanceHook):
    """Does nothing (the group's required noop driver)."""

    def _instance_created(self, uuid: str) -> None:
        pass

    def _instance_deleted(self, uuid: str) -> None:
        pass
