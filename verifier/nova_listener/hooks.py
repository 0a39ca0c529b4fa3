"""Instance lifecycle hooks of the Nova notification listener.

Stevedore group ``verifier.instance_hooks``. The verifier's own reaction
(mark the node's instance created, unenrol it) is built into the listener;
hooks are for other provider-side parts: the vTPM manager plugs in here
(driver ``vtpm``, :mod:`vtpm_manager.instance_hook`: on ``instance_deleted``
it drops the instance's provider EK registration at the registrar).

The interface (:class:`InstanceHook` and its errors) is in
:mod:`verifier.common.plugins`; it is re-exported here.
"""

from __future__ import annotations

from verifier.common.plugins import (
    InstanceHook,
    InstanceHookError,
    InstanceHookRetryError,
)

__all__ = ["InstanceHook", "InstanceHookError", "InstanceHookRetryError", "NoopHook"]


class NoopHook(InstanceHook):
    """Does nothing (the group's required noop driver)."""

    def _instance_created(self, uuid: str) -> None:
        pass

    def _instance_deleted(self, uuid: str) -> None:
        pass
