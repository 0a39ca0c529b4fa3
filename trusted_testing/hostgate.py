"""Helpers for the registrar's host gate on emulated compute hosts (trusted
compute pools, issue 29), shared by the gate stories with and without Nova.

* :func:`gate_registrar_options`: the registrar's ``[registrar]`` options
  for the gate (``host_trust = required``, the vendor's EK CA bundle, the
  operator as provider and admin client);
* :func:`https_call`: one call with a certificate of the cluster's PKI;
* :func:`start_host_agent`: the real ``trusted-agent`` on an
  :class:`~trusted_testing.hosttpm.EmulatedHost`'s platform TPM;
* :func:`enrol_host`: the operator's host policies (made from the host)
  uploaded and the host enrolled with the verifier (``POST /v1/hosts``);
* :func:`enrol_host_ca`: the host's local CA enrolled with the registrar;
* :func:`new_vtpm`: a vTPM made on the host for an instance, served by its
  own swtpm, its placement recorded at the registrar;
* :func:`register_vtpm`: the guest agent's registration code on a vTPM.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from node_agent.registration import Contact, register
from trusted_testing.cluster import LocalCluster, free_port
from trusted_testing.cluster_node import NodeHandle
from trusted_testing.hosttpm import EmulatedHost, VendorCa
from trusted_testing.swtpm import Swtpm, free_port_pair
from verifier.common.http import AsyncClient
from verifier.common.swtpm_localca import ek_ca_bundle
from verifier.common.tls import client_context
from verifier.common.tpm import Tpm
from verifier.common.tpm_access import TpmAccess
from verifier.protocol.messages.policies import PolicyUpload

__all__ = [
    "GATE_VERIFIER_OPTIONS",
    "enrol_host",
    "enrol_host_ca",
    "gate_registrar_options",
    "https_call",
    "new_vtpm",
    "register_vtpm",
    "registered",
    "start_host_agent",
    "write_vendor_bundle",
]

#: ``[verifier]`` options: the operator's certificate is a service (it
#: enrols hosts) with a project of its own (its stored host policies)
GATE_VERIFIER_OPTIONS: dict[str, Any] = {
    "operator_clients": "operator",
    "tenant_clients": "tenant,operator",
}


def write_vendor_bundle(vendor: VendorCa, path: str) -> str:
    """Write the vendor's EK CA certificate to ``path``; return it."""
    with open(path, "wb") as f:
        f.write(vendor.pem())
    return path


def gate_registrar_options(bundle: str) -> dict[str, Any]:
    """``[registrar]`` options of the gate: ``host_trust = required``,
    ``bundle`` (the platform TPM vendors' EK CAs) as ``ek_ca_bundle``, the
    operator's certificate as provider and admin client."""
    return {
        "host_trust": "required",
        "ek_ca_bundle": bundle,
        "provider_clients": "operator",
        "admin_clients": "operator",
    }


def https_call(
    cluster: LocalCluster, who: str | None, method: str, url: str, body: Any = None
) -> tuple[int, Any]:
    """``method url`` with ``who``'s certificate of the cluster's PKI (None:
    none); (status, JSON body)."""
    pki = cluster.pki_file
    cert = pki(f"{who}.pem") if who else None
    key = pki(f"{who}-key.pem") if who else None
    context = client_context(cert, key, pki("ca.pem"))

    async def go() -> tuple[int, Any]:
        async with AsyncClient(context, 30.0) as http:
            answer = await http.request(method, url, json=body)
            return answer.status, answer.data

    return asyncio.run(go())


def registered(cluster: LocalCluster, uuid: str) -> bool:
    """Whether the registrar has ``uuid`` registered and activated."""
    url = f"{cluster.registrar_url}/v1/agents/{uuid}"
    status, data = https_call(cluster, "verifier", "GET", url)
    return status == 200 and bool(data["activated"])


def start_host_agent(
    cluster: LocalCluster, host: EmulatedHost, provider: str, index: int = 90
) -> NodeHandle:
    """The real ``trusted-agent`` on ``host``'s platform TPM, under its
    resource provider UUID ``provider``, without a client certificate (its
    identity is its TPM) or a bootstrap file; registered and activated
    (stopped with the cluster).

    Raises:
        AssertionError: it did not register within 60 s.
    """
    node = NodeHandle(
        uuid=provider,
        index=index,
        dir=host.dir,
        swtpm=host.tpm,
        port=free_port(),
        kernel=host.kernel,
        agent_options={"cert_file": None, "key_file": None},
    )
    cluster.nodes.append(node)  # stopped with the cluster
    cluster.start_agent(node)
    deadline = time.monotonic() + 60
    while not registered(cluster, provider):
        if time.monotonic() > deadline:
            raise AssertionError(f"host agent {provider} not registered: {node.log}")
        time.sleep(0.5)
    return node


def _expect(what: str, answer: tuple[int, Any], status: int = 201) -> None:
    if answer[0] != status:
        raise AssertionError(f"{what}: {answer[0]} {answer[1]}")


def enrol_host_ca(cluster: LocalCluster, host: EmulatedHost) -> None:
    """The operator enrols ``host``'s swtpm local CA with the registrar
    (``PUT /v1/provider/hosts/{host}``; make a vTPM there first).

    Raises:
        AssertionError: the registrar did not answer 201.
    """
    url = f"{cluster.registrar_url}/v1/provider/hosts/{host.name}"
    body = {"ca_certificate": ek_ca_bundle(host.localca).decode()}
    _expect(f"{host.name}'s CA", https_call(cluster, "operator", "PUT", url, body))


def enrol_host(
    cluster: LocalCluster, host: EmulatedHost, provider: str, directory: str
) -> None:
    """The operator uploads ``host``'s runtime and measured-boot policies
    (:meth:`~trusted_testing.hosttpm.EmulatedHost.write_policies`, written
    under ``directory`` and read back as an operator would) as
    ``<name>-runtime`` and ``compute-host-fw`` (one for all hosts), and
    enrols the host with the
    verifier (``POST /v1/hosts``, no PCR policy) under ``provider``.

    Raises:
        AssertionError: the verifier did not answer 201.
    """
    runtime, mb = host.write_policies(directory)
    # the measured-boot policy is the same for every host: stored once
    names = {"runtime": f"{host.name}-runtime", "measured-boot": "compute-host-fw"}
    for kind, path in (("runtime", runtime), ("measured-boot", mb)):
        with open(path, encoding="utf-8") as f:
            upload = PolicyUpload(json.load(f), names[kind]).to_dict()
        url = f"{cluster.verifier_url}/v1/policies/{kind}"
        status, data = https_call(cluster, "operator", "POST", url, upload)
        if status not in (200, 201):  # 200: that policy was there already
            raise AssertionError(f"{kind} policy: {status} {data}")
    body = {
        "provider": provider,
        "hypervisor_hostname": host.name,
        "policy": {"pcrs": {}},
        "runtime_policy": names["runtime"],
        "mb_policy": names["measured-boot"],
    }
    url = f"{cluster.verifier_url}/v1/hosts"
    _expect(f"{host.name} enrolled", https_call(cluster, "operator", "POST", url, body))


def new_vtpm(cluster: LocalCluster, host: EmulatedHost, uuid: str) -> Swtpm:
    """A vTPM libvirt makes on ``host`` for instance ``uuid`` (an EK
    certificate from the host's CA naming the instance), served by its own
    swtpm (started; stop it); the registrar told where Nova placed the
    instance (``PUT /v1/provider/instances/{uuid}``, as the vTPM manager's
    instance hook does).

    Raises:
        AssertionError: the registrar did not answer 201.
    """
    host.make_vtpm(uuid)
    state = os.path.join(host.dir, "vtpms", uuid, "tpm2")
    swtpm = Swtpm(state, free_port_pair(), host.localca)
    swtpm.start()
    url = f"{cluster.registrar_url}/v1/provider/instances/{uuid}"
    answer = https_call(cluster, "operator", "PUT", url, {"host": host.name})
    _expect(f"{uuid} placed on {host.name}", answer)
    return swtpm


def register_vtpm(
    cluster: LocalCluster, uuid: str, tcti: str, tls_cert_pem: bytes
) -> None:
    """The guest agent's registration (anonymous, by its TPM at ``tcti``)
    as ``uuid``; ``tls_cert_pem`` is any certificate (never used here).

    Raises:
        RegistrationError: the registrar refused.
    """
    contact = Contact(
        uuid=uuid,
        registrar_url=cluster.registrar_url,
        ca_file=cluster.pki_file("ca.pem"),
        cert_file=None,
        key_file=None,
        tls_cert_pem=tls_cert_pem,
        host="127.0.0.1",
        port=9,
    )
    tpm = TpmAccess(lambda: Tpm(tcti, "rsa", "ecc"))
    asyncio.run(register(contact, tpm))
