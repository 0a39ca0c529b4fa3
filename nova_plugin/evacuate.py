"""Move every guest off a compute host through Nova's API (trusted compute
pools: a host that lost its attestation is drained by the operator).

Each guest of the host (``GET /servers/detail?all_tenants=1&host=NAME``,
as an admin) is moved one at a time, the scheduler choosing where (so a
flavor or image requiring ``CUSTOM_ATTESTATION_TRUSTED`` lands only on an
attested host):

* live migration (``os-migrateLive``, ``host`` None, ``block_migration``
  ``auto``) when its flavor has ``hw:tpm_secret_security=host`` — the only
  vTPM secret mode Nova 34 live-migrates (it refuses ``user`` and
  ``deployment`` with "Operation ... is not supported for vTPM");
* cold migration (``migrate``) otherwise, confirmed (``confirmResize``)
  once the guest waits in ``VERIFY_RESIZE``.

Without ``wait`` the moves are only requested (a cold migration is then
left for the operator, or Nova's ``resize_confirm_window``, to confirm).
What Nova refused or what failed is reported with Nova's own reason: the
API's refusal, the guest's fault, or the failed event of the instance
action (``os-instance-actions``, microversion 2.84 gives its details).
"""

from __future__ import annotations

import dataclasses
import enum
import time
import uuid as uuid_mod
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from keystoneauth1 import exceptions as ks_exceptions

from nova_plugin.exceptions import ServiceError, UsageError

__all__ = ["ComputeApi", "Evacuation", "Move", "Outcome", "move_of"]

#: 2.56: cold migration with an optional host; 2.47+ embeds the flavor
#: with its extra specs in a server; 2.25+ ``block_migration: auto``
MICROVERSION = "2.56"
#: instance actions' events carry ``details`` (the failure's message)
ACTIONS_MICROVERSION = "2.84"
#: statuses a guest can be moved from
_LIVE_FROM = ("ACTIVE", "PAUSED")
_COLD_FROM = ("ACTIVE", "SHUTOFF")


class Move(enum.Enum):
    """How a guest is moved."""

    LIVE = "live migration"
    COLD = "cold migration"


def move_of(server: dict[str, Any]) -> Move:
    """How ``server`` (as ``GET /servers/detail`` at 2.47+ shows it to an
    admin) is moved: live only when Nova can live-migrate its vTPM."""
    flavor = server.get("flavor") or {}
    specs = flavor.get("extra_specs") or {}
    if specs.get("hw:tpm_secret_security") == "host":
        return Move.LIVE
    return Move.COLD


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What happened to one guest.

    Attributes:
        uuid, name: the guest.
        move: how it was (or would be) moved.
        moved_to: the host it runs on now (None: not moved, or not waited).
        reason: why it could not be moved (None: it was, or the move is
            under way).
        requested: the move was asked of Nova and not waited for.
        dry_run: nothing was asked of Nova.
    """

    uuid: str
    name: str
    move: Move
    moved_to: str | None = None
    reason: str | None = None
    requested: bool = False
    dry_run: bool = False

    @property
    def failed(self) -> bool:
        return self.reason is not None

    def line(self) -> str:
        """One line for the operator."""
        who = f"{self.uuid} ({self.name})"
        if self.reason is not None:
            return f"{who}: could not: {self.reason}"
        if self.dry_run:
            return f"{who}: would move by {self.move.value}"
        if self.requested:
            return f"{who}: {self.move.value} requested"
        return f"{who}: moved to {self.moved_to} by {self.move.value}"


def _is_uuid(text: str) -> bool:
    try:
        return str(uuid_mod.UUID(text)) == text.lower()
    except ValueError:
        return False


def _message(body: Any, fallback: str) -> str:
    """Nova's error message (``{"badRequest": {"message": ...}}``)."""
    if isinstance(body, dict):
        for value in body.values():
            if isinstance(value, dict) and isinstance(value.get("message"), str):
                return str(value["message"])
    return fallback


class ComputeApi:
    """The calls ``host evacuate`` makes to Nova's compute API, over a
    keystoneauth session (the ``openstack`` client's own)."""

    def __init__(
        self,
        session: Any,
        *,
        interface: str | None = None,
        region_name: str | None = None,
    ) -> None:
        self._session = session
        self._filter = {
            "service_type": "compute",
            "interface": interface or "public",
            "region_name": region_name,
        }

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        microversion: str = MICROVERSION,
    ) -> Any:
        try:
            resp = self._session.request(
                path,
                method,
                json=body,
                endpoint_filter=self._filter,
                headers={"OpenStack-API-Version": f"compute {microversion}"},
                raise_exc=False,
            )
        except ks_exceptions.ClientException as exc:
            raise ServiceError(f"Nova's API cannot be reached: {exc}") from exc
        try:
            data = resp.json() if resp.content else None
        except ValueError:
            data = None
        if resp.status_code >= 400:
            reason = _message(data, f"HTTP {resp.status_code}")
            raise ServiceError(reason, status=resp.status_code)
        return data

    def host_of_node(self, node: str) -> str | None:
        """The host name of the compute node (= its resource provider)
        ``node``, or None if Nova has no such node."""
        try:
            data = self._call("GET", f"/os-hypervisors/{node}", microversion="2.53")
        except ServiceError as exc:
            if exc.status in (400, 404):
                return None
            raise
        return str(data["hypervisor"]["service"]["host"])

    def compute_host_exists(self, host: str) -> bool:
        """Whether a ``nova-compute`` service runs under that host name."""
        query = urlencode({"binary": "nova-compute", "host": host})
        data = self._call("GET", f"/os-services?{query}")
        return bool(data and data.get("services"))

    def servers_on(self, host: str) -> list[dict[str, Any]]:
        """Every project's guests on ``host``."""
        query = urlencode({"all_tenants": "1", "host": host})
        data = self._call("GET", f"/servers/detail?{query}")
        return list(data["servers"])

    def server(self, uuid: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/servers/{uuid}")["server"])

    def action(self, uuid: str, body: dict[str, Any]) -> None:
        """A server action (raises :class:`ServiceError` on a refusal)."""
        self._call("POST", f"/servers/{uuid}/action", body)

    def failure(self, uuid: str, action: str) -> str | None:
        """The details of the newest failed event of the guest's newest
        ``action`` (e.g. ``live-migration``), if any."""
        path = f"/servers/{uuid}/os-instance-actions"
        actions = self._call("GET", path, microversion=ACTIONS_MICROVERSION)
        for item in actions.get("instanceActions", []):
            if item.get("action") != action:
                continue
            detail = self._call(
                "GET",
                f"{path}/{item['request_id']}",
                microversion=ACTIONS_MICROVERSION,
            )
            for event in detail["instanceAction"].get("events", []):
                if event.get("result") == "Error":
                    return str(event.get("details") or event.get("event"))
            return None
        return None


class Evacuation:
    """Moves the guests of one host, one at a time.

    Args:
        api: Nova's API.
        timeout: how long one guest's move is waited for, seconds.
        poll: how often a moving guest is looked at, seconds.
        clock, sleep: time (given in for tests).
    """

    def __init__(
        self,
        api: ComputeApi,
        *,
        timeout: float = 600.0,
        poll: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._api = api
        self._timeout = timeout
        self._poll = poll
        self._clock = clock
        self._sleep = sleep

    def resolve(self, host: str) -> str:
        """The host name of ``host``: a host name, or the UUID of its
        compute node (its resource provider, as ``host show`` takes it).

        Raises:
            UsageError: Nova knows no such host or node.
        """
        if _is_uuid(host):
            name = self._api.host_of_node(host)
            if name is None:
                raise UsageError(f"{host}: no compute node has that UUID")
            return name
        if not self._api.compute_host_exists(host):
            raise UsageError(f"{host}: no nova-compute service has that host name")
        return host

    def run(self, host: str, *, dry_run: bool, wait: bool) -> list[Outcome]:
        """Move (or with ``dry_run`` only list) every guest of ``host`` (a
        host name, or its compute node's UUID).

        Raises:
            UsageError: no compute service has that host name.
            ServiceError: Nova's API could not list the host's guests.
        """
        host = self.resolve(host)
        outcomes = []
        for server in self._api.servers_on(host):
            move = move_of(server)
            base = Outcome(str(server["id"]), str(server.get("name", "")), move)
            allowed = _LIVE_FROM if move is Move.LIVE else _COLD_FROM
            if server.get("status") not in allowed:
                status = server.get("status")
                outcomes.append(
                    dataclasses.replace(base, reason=f"its status is {status}")
                )
            elif dry_run:
                outcomes.append(dataclasses.replace(base, dry_run=True))
            else:
                outcomes.append(self._move(base, host, wait))
        return outcomes

    def _move(self, base: Outcome, host: str, wait: bool) -> Outcome:
        if base.move is Move.LIVE:
            body: dict[str, Any] = {
                "os-migrateLive": {"host": None, "block_migration": "auto"}
            }
        else:
            body = {"migrate": None}
        try:
            self._api.action(base.uuid, body)
            if not wait:
                return dataclasses.replace(base, requested=True)
            return self._settle(base, host)
        except ServiceError as exc:
            return dataclasses.replace(base, reason=str(exc))

    def _settle(self, base: Outcome, host: str) -> Outcome:
        """Wait for the move to end; confirm a cold migration."""
        server = self._until_still(base.uuid)
        if server["status"] == "VERIFY_RESIZE":
            self._api.action(base.uuid, {"confirmResize": None})
            server = self._until_still(base.uuid, leave=("VERIFY_RESIZE",))
        where = server.get("OS-EXT-SRV-ATTR:host")
        if server["status"] != "ERROR" and where and where != host:
            return dataclasses.replace(base, moved_to=str(where))
        action = "live-migration" if base.move is Move.LIVE else "migrate"
        fault = (server.get("fault") or {}).get("message")
        reason = fault or self._api.failure(base.uuid, action)
        if server["status"] == "ERROR":
            reason = f"the guest is in ERROR on {where}: {reason or 'no reason given'}"
        return dataclasses.replace(
            base, reason=reason or f"Nova left it on {host} ({server['status']})"
        )

    def _until_still(self, uuid: str, leave: tuple[str, ...] = ()) -> dict[str, Any]:
        """The guest once no task runs on it (and its status is none of
        ``leave``)."""
        deadline = self._clock() + self._timeout
        while True:
            server = self._api.server(uuid)
            busy = server.get("OS-EXT-STS:task_state") is not None
            if not busy and server["status"] not in leave:
                return server
            if self._clock() > deadline:
                raise ServiceError(
                    f"still {server['status']} "
                    f"({server.get('OS-EXT-STS:task_state')}) after "
                    f"{self._timeout:.0f} s"
                )
            self._sleep(self._poll)
