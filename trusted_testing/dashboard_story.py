"""The attestation dashboard's deployment, as the browser tests and
``tools/dashboard-screenshots.py`` use it.

Given a real Keystone with projects ``alpha`` (``alice`` member, ``rita``
reader) and ``beta`` (``bob`` member) and the Nova compute stand-in in its
catalog (:func:`verifier.tests.functional.tenancy_base.shared_keystone`),
:meth:`DashboardDeployment.start` runs the registrar and the verifier as
processes with ``auth_strategy = keystone`` (:class:`LocalCluster`), puts
the verifier in the catalog as service type ``attestation``, starts four
agents on swtpm (three of alpha's servers, one of beta's), has each project
enrol its nodes and a measured-boot policy with its users' tokens, waits
until every node is attested, and serves Horizon with the plugin's enabled
files (:class:`~trusted_testing.horizon.Horizon`).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
from typing import Any

import requests

import attestation_dashboard
from trusted_testing.cluster import LocalCluster, NodeHandle, wait_until
from trusted_testing.horizon import Horizon
from trusted_testing.keystone import Keystone, KeystoneUser

__all__ = ["NODE_NAMES", "DashboardDeployment", "StoryNode"]

#: the story's nodes: name -> the user whose project owns it
NODE_NAMES = {"web": "alice", "db": "alice", "cache": "alice", "batch": "bob"}


@dataclasses.dataclass
class StoryNode:
    """One node of the story: its agent and the user who enrolled it."""

    name: str
    owner: str
    handle: NodeHandle

    @property
    def uuid(self) -> str:
        return self.handle.uuid


class DashboardDeployment:
    """Keystone's projects' nodes on swtpm, the verifier, and Horizon.

    Args:
        work_dir: the cluster's and Horizon's files (created).
        keystone: the running Keystone.
        nova: the compute stand-in in Keystone's catalog (``add_server``).
        users: its users by name (``alice``, ``rita``, ``bob``).
        tokens: project-scoped tokens by user name (``admin`` too).
    """

    def __init__(
        self,
        work_dir: str,
        keystone: Keystone,
        nova: Any,
        users: dict[str, KeystoneUser],
        tokens: dict[str, str],
    ) -> None:
        self.work_dir = work_dir
        self.keystone = keystone
        self.nova = nova
        self.users = users
        self.tokens = tokens
        self.cluster = LocalCluster(
            os.path.join(work_dir, "cluster"),
            nodes=len(NODE_NAMES),
            interval=1.0,
            verifier_options={"auth_strategy": "keystone"},
            verifier_sections={"keystone_authtoken": keystone.authtoken_options()},
        )
        self.horizon = Horizon(
            os.path.join(work_dir, "horizon"),
            keystone.url,
            enabled_files=attestation_dashboard.enabled_files(),
            packages=["attestation_dashboard"],
            policy_files={"attestation": attestation_dashboard.POLICY_FILE},
            ssl_cacert=self.cluster.pki_file("ca.pem"),
        )
        self.nodes: dict[str, StoryNode] = {}
        self._service: str | None = None
        self._http = requests.Session()
        self._http.trust_env = False

    # -- set-up ----------------------------------------------------------------

    def start(self) -> None:
        """Everything, in order; :meth:`stop` undoes what was done."""
        self.cluster.start_services()
        self._http.verify = self.cluster.pki_file("ca.pem")
        self._service = self.keystone.add_service(
            "attestation", "trusted-cloud", self.cluster.verifier_url
        )
        for handle, (name, owner) in zip(
            self.cluster.nodes, NODE_NAMES.items(), strict=True
        ):
            self.nova.add_server(handle.uuid, self.users[owner].project_id)
            self.cluster.start_agent(handle)
            self.nodes[name] = StoryNode(name, owner, handle)
        self.upload_policy("alice", "measured-boot", "golden", {"secure_boot": True})
        for node in self.nodes.values():
            self.enrol(node)
        for node in self.nodes.values():
            self.wait_state(node, "attested")
        self.horizon.start()

    def stop(self) -> None:
        self.horizon.stop()
        self.cluster.stop()
        if self._service is not None:
            self.keystone.delete_service(self._service)
            self._service = None
        self._http.close()

    # -- the API, as a user --------------------------------------------------

    def api(
        self, who: str, method: str, path: str, body: Any = None
    ) -> requests.Response:
        """``method path`` on the verifier with ``who``'s token."""
        headers = {"X-Auth-Token": self.tokens[who]}
        return self._http.request(
            method,
            self.cluster.verifier_url + path,
            json=body,
            headers=headers,
            timeout=60,
        )

    def node(self, who: str, node: StoryNode) -> dict[str, Any]:
        """The API's view of ``node`` as ``who`` (200 asserted)."""
        resp = self.api(who, "GET", f"/v1/nodes/{node.uuid}")
        if resp.status_code != 200:
            raise AssertionError(
                f"GET node {node.name}: {resp.status_code} {resp.text}"
            )
        data: dict[str, Any] = resp.json()
        return data

    def enrol(self, node: StoryNode) -> None:
        body = {
            "uuid": node.uuid,
            "v": base64.b64encode(os.urandom(32)).decode(),
            "u_commitment": base64.b64encode(bytes(32)).decode(),
            "policy": {"hash": "sha256", "pcrs": {"16": [self.cluster.good_pcr_hex()]}},
        }
        resp = self.api(node.owner, "POST", "/v1/nodes", body)
        if resp.status_code != 201:
            raise RuntimeError(f"enrol {node.name}: {resp.status_code} {resp.text}")

    def upload_policy(
        self, who: str, kind: str, name: str, document: dict[str, Any]
    ) -> None:
        body = {"name": name, "policy": document}
        resp = self.api(who, "POST", f"/v1/policies/{kind}", body)
        if resp.status_code != 201:
            raise RuntimeError(f"policy {name}: {resp.status_code} {resp.text}")

    def wait_state(self, node: StoryNode, state: str, timeout: float = 60) -> None:
        """Until the API says ``node`` is in ``state``."""
        wait_until(
            lambda: self.node(node.owner, node)["state"] == state,
            timeout,
            what=f"{node.name} {state}",
        )

    # -- events of the story ---------------------------------------------------

    def tamper(self, node: StoryNode) -> None:
        """Something unexpected is measured on ``node``'s TPM."""
        self.cluster.tamper(node.handle)

    def stop_verifier(self) -> None:
        """The API stops answering (its process is killed)."""
        self.cluster.kill_verifier(0)

    def start_verifier(self) -> None:
        self.cluster.start_verifier(0)

    def describe(self) -> str:
        """The deployment in one JSON line (for a failing test's details)."""
        return json.dumps(
            {
                "horizon": self.horizon.url,
                "verifier": self.cluster.verifier_url,
                "nodes": {n.name: n.uuid for n in self.nodes.values()},
            }
        )
