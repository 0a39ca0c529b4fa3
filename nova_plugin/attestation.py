"""The verifier's tenant API over the user's Keystone session.

:class:`AttestationClient` finds the verifier in the service catalog
(service type ``attestation``) and calls it with the caller's
keystoneauth session, as every OpenStack client does: no tenant
certificate. Every refusal or transport failure becomes one
:class:`~nova_plugin.exceptions.ServiceError` carrying the verifier's
error code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

from keystoneauth1 import adapter
from keystoneauth1 import exceptions as ks_exceptions

from nova_plugin.event_filters import next_params
from nova_plugin.exceptions import ServiceError

__all__ = ["SERVICE_TYPE", "AttestationClient"]

SERVICE_TYPE = "attestation"
POLICY_KINDS = ("runtime", "measured-boot")


class AttestationClient:
    """The attestation service of the catalog, on ``session``.

    Args:
        session: the user's keystoneauth session.
        interface: the catalog interface (``public``, ``internal``).
        region_name: the catalog region, or None.
        endpoint_override: a URL to use instead of the catalog's.
    """

    def __init__(
        self,
        session: Any,
        interface: str | None = "public",
        region_name: str | None = None,
        endpoint_override: str | None = None,
    ) -> None:
        self._api = adapter.Adapter(
            session,
            service_type=SERVICE_TYPE,
            interface=interface,
            region_name=region_name,
            endpoint_override=endpoint_override,
        )

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """One call; the JSON answer (None for 204).

        Raises:
            ServiceError: refused (with the verifier's code) or unreachable.
        """
        try:
            resp = self._api.request(path, method, json=body, raise_exc=False)
        except ks_exceptions.ClientException as exc:
            raise ServiceError(f"attestation service: {exc}") from None
        if resp.status_code == 204:
            return None
        try:
            data = resp.json()
        except ValueError:
            data = None
        if 200 <= resp.status_code < 300 and data is not None:
            return data
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict):
            code, message = error.get("code"), error.get("message")
        else:
            code, message = None, resp.text[:200] or resp.reason
        raise ServiceError(
            f"attestation service: {method} {path}: HTTP {resp.status_code} "
            f"{code or ''}: {message}",
            resp.status_code,
            code if isinstance(code, str) else None,
        )

    # -- nodes ------------------------------------------------------------

    def list_nodes(self) -> list[dict[str, Any]]:
        return list(self.call("GET", "/v1/nodes")["nodes"])

    def get_node(self, uuid: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/v1/nodes/{quote(uuid)}"))

    def revoke_node(self, uuid: str, detail: str | None = None) -> dict[str, Any]:
        body = {"detail": detail} if detail else {}
        return dict(self.call("POST", f"/v1/nodes/{quote(uuid)}/revoke", body))

    def set_node_policy(
        self, uuid: str, changes: dict[str, str | None]
    ) -> dict[str, Any]:
        """``PUT /v1/nodes/{uuid}/policy``: ``changes`` maps
        ``runtime_policy``/``mb_policy`` to a reference or None."""
        path = f"/v1/nodes/{quote(uuid)}/policy"
        return dict(self.call("PUT", path, changes))

    def delete_node(self, uuid: str) -> None:
        self.call("DELETE", f"/v1/nodes/{quote(uuid)}")

    # -- compute hosts (the operator's) -----------------------------------

    def enrol_host(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /v1/hosts`` (a ``HostEnrolmentRequest`` body)."""
        return dict(self.call("POST", "/v1/hosts", dict(body)))

    def list_hosts(self) -> list[dict[str, Any]]:
        return list(self.call("GET", "/v1/hosts")["hosts"])

    def get_host(self, ref: str) -> dict[str, Any]:
        """A host by provider UUID or hypervisor host name, with its guests."""
        return dict(self.call("GET", f"/v1/hosts/{quote(ref, safe='')}"))

    def delete_host(self, ref: str) -> None:
        self.call("DELETE", f"/v1/hosts/{quote(ref, safe='')}")

    def events(self, uuid: str | None = None) -> list[dict[str, Any]]:
        """Every event of node ``uuid`` (or of every node the caller
        sees), oldest first, following every page."""
        query = {"limit": "1000", **({"node": uuid} if uuid else {})}
        return list(reversed(self.list_events(query, True)["events"]))

    def list_events(
        self, params: Mapping[str, str], all_pages: bool = False
    ) -> dict[str, Any]:
        """``GET /v1/events`` with the query ``params`` (newest first);
        with ``all_pages``, the pages after it too (following the ``next``
        links). Returns ``{"events": [...], "links": [...]}``."""
        query: Mapping[str, str] | None = params
        events: list[dict[str, Any]] = []
        links: list[dict[str, Any]] = []
        while query is not None:
            data = self.call("GET", f"/v1/events?{urlencode(query)}")
            events += data["events"]
            links = list(data.get("links", []))
            query = next_params(links) if all_pages else None
        return {"events": events, "links": links}

    def history(
        self, uuid: str, since: str | None = None, until: str | None = None
    ) -> dict[str, Any]:
        """A node's attestation log entries with their proofs (unverified)."""
        query = {k: v for k, v in (("since", since), ("until", until)) if v}
        path = f"/v1/nodes/{quote(uuid)}/history"
        return dict(self.call("GET", path + ("?" + urlencode(query) if query else "")))

    def log_checkpoint(self) -> dict[str, Any]:
        """The log's latest signed checkpoint and the key that signs it."""
        return dict(self.call("GET", "/v1/log/checkpoint?format=json"))

    def log_consistency(self, old: int, new: int) -> dict[str, Any]:
        query = urlencode({"from": old, "to": new})
        return dict(self.call("GET", f"/v1/log/consistency?{query}"))

    def enrol(self, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self.call("POST", "/v1/nodes", body))

    # -- policies ---------------------------------------------------------

    def create_policy(
        self, kind: str, policy: dict[str, Any], name: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"policy": policy}
        if name is not None:
            body["name"] = name
        return dict(self.call("POST", f"/v1/policies/{quote(kind)}", body))

    def list_policies(self, kind: str) -> list[dict[str, Any]]:
        return list(self.call("GET", f"/v1/policies/{quote(kind)}")["policies"])

    def get_policy(self, kind: str, ref: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/v1/policies/{quote(kind)}/{quote(ref)}"))

    def delete_policy(self, kind: str, ref: str) -> None:
        self.call("DELETE", f"/v1/policies/{quote(kind)}/{quote(ref)}")

    def check_policy(
        self, ref: str, nodes: list[str] | None = None, everything: bool = False
    ) -> dict[str, Any]:
        """The dry run of runtime policy ``ref`` on ``nodes`` (or every
        node of the project): the verifier's report."""
        body: dict[str, Any] = {"all": True} if everything else {"nodes": nodes}
        path = f"/v1/policies/runtime/{quote(ref)}/check"
        return dict(self.call("POST", path, body))
