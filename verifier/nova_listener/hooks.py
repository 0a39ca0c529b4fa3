"""Instance lifecycle hooks of the Nova notification listener.

Stevedore group ``verifier.instance_hooks``. The verifier's own reaction
(mark the node's instance created, unenrol it) is built into the listener;
hooks are for other provider-side parts: the vTPM manager is meant to plug
in here (``instance_deleted``: drop the instance's companion vTPM and its
EK registration).
"""

from __future__ import annotations

import abc

__all__ = ["InstanceHook", "InstanceHookError", "NoopHook"]


class InstanceHookError(Exception):
    """A hook failed; the listener logs it and goes on."""


class InstanceHook(abc.ABC):
    """Called after the listener handled an instance event."""

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
            InstanceHookError: any failure of the hook.
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
