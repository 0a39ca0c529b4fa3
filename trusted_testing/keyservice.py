"""A key service process beside a :class:`~trusted_testing.cluster.LocalCluster`.

Its certificate comes from the cluster's operator CA; it trusts that CA
(tenant, verifier) and the node identity CA (nodes); it honours the
revocation events of the cluster's verifier. The process is started through
the cluster, so :meth:`LocalCluster.stop` stops it too.
"""

from __future__ import annotations

import os
from typing import Any

from trusted_testing.cluster import LocalCluster, _script
from trusted_testing.procs import _write_conf, wait_port
from verifier.api.verifier_app import public_pem
from verifier.ca import CertificateAuthority
from verifier.cmd.verifier import load_signing_key

__all__ = ["capability_sections", "start_keyservice"]


def capability_sections(
    cluster_dir: str, keyservice_port: int
) -> dict[str, dict[str, Any]]:
    """The verifier's ``[capabilities]`` section for a key service on
    ``keyservice_port`` (pass as ``LocalCluster(verifier_sections=...)``)."""
    return {
        "capabilities": {
            "key_file": os.path.join(os.path.dirname(cluster_dir), "capability.key"),
            "keyservice_url": f"https://127.0.0.1:{keyservice_port}",
            "ttl": 120,
        }
    }


def start_keyservice(cluster: LocalCluster, port: int) -> str:
    """Start ``trusted-keyservice`` on ``port``; its base URL."""
    pki = cluster.pki
    CertificateAuthority.load(pki).issue_to_files(
        pki, "keyservice", ["127.0.0.1", "localhost"]
    )
    bundle = os.path.join(cluster.workdir, "keyservice-clients-ca.pem")
    with open(bundle, "wb") as out:
        for path in (
            cluster.pki_file("ca.pem"),
            os.path.join(cluster.workdir, "node-ca", "ca.pem"),
        ):
            with open(path, "rb") as f:
                out.write(f.read())
    event_key = load_signing_key(os.path.join(cluster.workdir, "event-signing-key.pem"))
    event_pub = os.path.join(cluster.workdir, "event-signing-public.pem")
    with open(event_pub, "w", encoding="utf-8") as f:
        f.write(public_pem(event_key.public_key()))
    conf = os.path.join(cluster.workdir, "keyservice.conf")
    _write_conf(
        conf,
        {
            "DEFAULT": {
                "log_file": os.path.join(cluster.workdir, "keyservice.log"),
                "use_stderr": False,
            },
            "keyservice": {
                "port": port,
                "cert_file": cluster.pki_file("keyservice.pem"),
                "key_file": cluster.pki_file("keyservice-key.pem"),
                "ca_file": bundle,
                "capability_key_file": cluster.verifier_sections["capabilities"][
                    "key_file"
                ],
                "event_public_key_file": event_pub,
                "signing_key": os.path.join(cluster.workdir, "keyservice-signing.pem"),
                "state_file": os.path.join(cluster.workdir, "keyservice.json"),
            },
        },
    )
    log = os.path.join(cluster.workdir, "keyservice.out")
    proc = cluster._spawn(
        "keyservice", [_script("trusted-keyservice"), "--config-file", conf], log
    )
    wait_port(port, proc, os.path.join(cluster.workdir, "keyservice.log"))
    return f"https://127.0.0.1:{port}"
