"""The Neutron half of the stand-ins: one network with one IPv4 subnet
whose ports Nova's libvirt driver plugs as taps.

What Nova 34 asks of Neutron to boot a server on a network and delete it
(``nova.network.neutron``), answered from memory:

* ``GET /v2.0/extensions``: none (Nova then takes its plain paths: no
  port-binding API, no resource requests);
* ``GET /v2.0/quotas/{project}``: ports unlimited;
* ``GET /v2.0/{networks,subnets,ports,...}`` filtered by query (``id``,
  ``device_id``, ``network_id``, ``tenant_id``, ``device_owner``, ...),
  and ``GET /v2.0/{collection}/{id}``;
* ``POST /v2.0/ports``: a port with a MAC and the next free address of
  the subnet, status ``ACTIVE`` (so Nova waits for no ``network-vif-
  plugged`` event: no agent would send one), ``binding:vif_type`` ``tap``
  (Nova makes a tap device and gives libvirt ``<interface
  type='ethernet'>``; Linux bridge VIFs are gone from Nova 34);
* ``PUT /v2.0/ports/{id}`` (binding and device fields), ``DELETE``.

The subnet has no DHCP: Nova writes the port's address, the gateway and
the route into the config drive's ``network_data.json``, and cloud-init
configures the guest from it. Addresses are those of the
:class:`~trusted_testing.nova.guestnet.GuestNetwork` namespace.
"""

from __future__ import annotations

import copy
import threading
import uuid as uuid_mod
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["NeutronState"]

NETWORK_ID = "0c0f1e3a-7d16-4b1e-9d16-7e57ed000016"
SUBNET_ID = "5b0e7a56-16c1-4d2e-8c16-7e57ed000016"
_IGNORED = frozenset({"fields", "limit", "marker", "sort_key", "sort_dir"})

Reply = tuple[int, Any]


class NeutronState:
    """The network, its subnet and its ports.

    Args:
        project_id: the project owning the network.
        gateway: the subnet's gateway (the host's services as guests see
            them).
        address: ``address(i)`` is the ``i``-th guest address (from 2).
        prefix: the subnet's prefix length.
        on_port: called with each new port (the test's forwarder).
    """

    def __init__(
        self,
        project_id: str,
        gateway: str,
        address: Callable[[int], str],
        prefix: int = 24,
        on_port: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._address = address
        self._next = 2
        self._on_port = on_port
        network_part = gateway.rsplit(".", 1)[0]
        self.collections: dict[str, dict[str, dict[str, Any]]] = {
            "networks": {
                NETWORK_ID: {
                    "id": NETWORK_ID,
                    "name": "trusted-guests",
                    "tenant_id": project_id,
                    "project_id": project_id,
                    "status": "ACTIVE",
                    "admin_state_up": True,
                    "shared": True,
                    "subnets": [SUBNET_ID],
                    "mtu": 1500,
                    "port_security_enabled": False,
                    "router:external": False,
                }
            },
            "subnets": {
                SUBNET_ID: {
                    "id": SUBNET_ID,
                    "name": "trusted-guests-v4",
                    "network_id": NETWORK_ID,
                    "tenant_id": project_id,
                    "project_id": project_id,
                    "ip_version": 4,
                    "cidr": f"{network_part}.0/{prefix}",
                    "gateway_ip": gateway,
                    "enable_dhcp": False,
                    "dns_nameservers": [],
                    "host_routes": [],
                }
            },
            "ports": {},
        }

    @property
    def network_id(self) -> str:
        return NETWORK_ID

    def ports(self) -> list[dict[str, Any]]:
        with self._lock:
            return copy.deepcopy(list(self.collections["ports"].values()))

    # -- requests ------------------------------------------------------------

    def handle(
        self,
        method: str,
        parts: list[str],
        query: Mapping[str, list[str]],
        body: Any,
    ) -> Reply:
        """One ``/v2.0/...`` request (``parts`` after ``v2.0``)."""
        if not parts:
            return 404, {"message": "no collection"}
        name = parts[0].removesuffix(".json").replace("-", "_")
        with self._lock:
            if method == "GET":
                return self._get(name, parts[1:], query)
            if name == "ports" and method == "POST" and len(parts) == 1:
                return self._create_port(body)
            if name == "ports" and method == "PUT" and len(parts) == 2:
                return self._update_port(parts[1].removesuffix(".json"), body)
            if name == "ports" and method == "DELETE" and len(parts) == 2:
                port_id = parts[1].removesuffix(".json")
                port = self.collections["ports"].pop(port_id, None)
                return (204, None) if port else (404, {"message": "no such port"})
        return 404, {"message": f"not served by the stand-in: {method} {parts}"}

    def _get(self, name: str, rest: list[str], query: Mapping[str, list[str]]) -> Reply:
        if name == "extensions":
            return 200, {"extensions": []}
        if name == "quotas" and rest:
            return 200, {"quota": {"port": -1, "network": -1, "subnet": -1}}
        items = self.collections.get(name, {})
        if rest:
            found = items.get(rest[0].removesuffix(".json"))
            if found is None:
                return 404, {"message": f"{name[:-1]} {rest[0]} not found"}
            return 200, {name[:-1]: copy.deepcopy(found)}
        found_all = [copy.deepcopy(i) for i in items.values() if _match(i, query)]
        return 200, {name: found_all}

    def _create_port(self, body: Any) -> Reply:
        spec = dict((body or {}).get("port") or {})
        if spec.get("network_id") != NETWORK_ID:
            return 404, {"message": f"network {spec.get('network_id')} not found"}
        if self._next > 254:
            return 409, {"message": "no more addresses"}
        index, self._next = self._next, self._next + 1
        port_id = str(uuid_mod.uuid4())
        port = {
            "id": port_id,
            "name": spec.get("name", ""),
            "network_id": NETWORK_ID,
            "tenant_id": spec.get("tenant_id") or spec.get("project_id", ""),
            "project_id": spec.get("project_id") or spec.get("tenant_id", ""),
            "mac_address": f"fa:16:3e:16:{index // 256:02x}:{index % 256:02x}",
            "fixed_ips": [{"subnet_id": SUBNET_ID, "ip_address": self._address(index)}],
            "status": "ACTIVE",
            "admin_state_up": True,
            "device_id": "",
            "device_owner": "",
            "security_groups": [],
            "binding:host_id": "",
            "binding:vnic_type": "normal",
            "binding:profile": {},
        }
        port.update({k: v for k, v in spec.items() if k not in ("fixed_ips",)})
        port["binding:vif_type"] = "tap"
        port["binding:vif_details"] = {}
        self.collections["ports"][port_id] = port
        if self._on_port is not None:
            self._on_port(copy.deepcopy(port))
        return 201, {"port": copy.deepcopy(port)}

    def _update_port(self, port_id: str, body: Any) -> Reply:
        port = self.collections["ports"].get(port_id)
        if port is None:
            return 404, {"message": f"port {port_id} not found"}
        changes = dict((body or {}).get("port") or {})
        for key in ("id", "fixed_ips", "mac_address", "binding:vif_type"):
            changes.pop(key, None)
        port.update(changes)
        port["binding:vif_details"] = {}
        return 200, {"port": copy.deepcopy(port)}


def _match(item: Mapping[str, Any], query: Mapping[str, list[str]]) -> bool:
    for key, wanted in query.items():
        if key in _IGNORED:
            continue
        if key == "fixed_ips":
            ips = {f"ip_address={ip['ip_address']}" for ip in item.get("fixed_ips", [])}
            if not ips & set(wanted):
                return False
            continue
        if key not in item or str(item[key]) not in wanted:
            return False
    return True
