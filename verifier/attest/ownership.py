"""Which verifier process attests which node.

One verifier alone owns every node (:class:`AllNodes`). Several verifier
processes sharing one SQL database split the nodes with a tooz partitioner
(a consistent hash ring over the live members of a group, with membership
kept by heartbeats in Redis, etcd, ZooKeeper, ...): :class:`ToozOwnership`.
When a member stops heartbeating, the ring drops it and the survivors take
its nodes at their next sync. tooz and its Redis driver are the ``scale``
extra.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import os
import socket
from typing import Any

from verifier.common import extras
from verifier.exceptions import ConfigError

LOG = logging.getLogger(__name__)

__all__ = ["AllNodes", "Ownership", "ToozOwnership", "make_ownership"]


class Ownership(abc.ABC):
    """Answers "is this node mine?" and keeps that answer current."""

    member_id = "single"

    @abc.abstractmethod
    def owns(self, uuid: str) -> bool: ...

    async def start(self) -> None:  # noqa: B027 (optional hook)
        """Join whatever group decides ownership."""

    async def refresh(self) -> None:  # noqa: B027 (optional hook)
        """Heartbeat and learn membership changes (called every sync)."""

    async def stop(self) -> None:  # noqa: B027 (optional hook)
        """Leave the group so that others take over at once."""


class AllNodes(Ownership):
    """A single verifier: every node is ours."""

    def owns(self, uuid: str) -> bool:
        return True


class ToozOwnership(Ownership):
    """Nodes split over the live members of a tooz group by a hash ring.

    Args:
        url: tooz backend URL, e.g.
            ``redis://127.0.0.1:6379?membership_timeout=2``.
        member_id: this process's name in the group.
        group: the group all verifiers of a deployment join.
    """

    def __init__(self, url: str, member_id: str, group: str = "trusted-verifiers"):
        self.url = url
        self.member_id = member_id
        self.group = group.encode()
        self._coordinator: Any = None
        self._partitioner: Any = None

    async def start(self) -> None:
        """Join the group.

        Raises:
            ConfigError: the backend's driver is not installed (e.g. redis
                without the ``scale`` extra).
        """
        await asyncio.to_thread(self._start)

    def _start(self) -> None:
        from tooz import coordination

        try:
            coordinator = coordination.get_coordinator(
                self.url, self.member_id.encode()
            )
        except ImportError as exc:
            raise ConfigError(f"[verifier] coordination_url: {extras.explain(exc)}")
        # tooz's own thread heartbeats, so a busy event loop never lets our
        # membership lapse
        coordinator.start(start_heart=True)
        try:
            coordinator.create_group(self.group).get()
        except coordination.GroupAlreadyExist:
            pass
        self._partitioner = coordinator.join_partitioned_group(self.group)
        self._coordinator = coordinator
        LOG.info("Joined verifier group %s as %s", self.group.decode(), self.member_id)

    async def refresh(self) -> None:
        await asyncio.to_thread(self._refresh)

    def _refresh(self) -> None:
        if self._coordinator is None:
            return
        self._coordinator.run_watchers()

    def owns(self, uuid: str) -> bool:
        if self._partitioner is None:
            return False
        return bool(self._partitioner.belongs_to_self(uuid))

    async def stop(self) -> None:
        if self._coordinator is not None:
            await asyncio.to_thread(self._stop)

    def _stop(self) -> None:
        assert self._coordinator is not None
        try:
            self._coordinator.leave_partitioned_group(self._partitioner)
        except Exception:  # leaving is best effort: the heartbeat expires anyway
            LOG.warning("Could not leave the verifier group cleanly", exc_info=True)
        self._coordinator.stop()
        self._coordinator = None


def make_ownership(
    coordination_url: str | None,
    member_id: str | None,
    group: str = "trusted-verifiers",
) -> Ownership:
    """The ownership for the configuration (AllNodes without a URL).

    Raises:
        ConfigError: if tooz (the ``scale`` extra) is missing for a
            configured URL.
    """
    if not coordination_url:
        return AllNodes()
    try:
        # Imported here, in the caller's thread: it imports eventlet, and a
        # worker thread that imports eventlet never ends (asyncio.run then
        # waits for ever for its default executor at shutdown).
        import tooz.coordination  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"[verifier] coordination_url: {extras.explain(exc)}")
    member = member_id or f"{socket.gethostname()}-{os.getpid()}"
    return ToozOwnership(coordination_url, member, group)
