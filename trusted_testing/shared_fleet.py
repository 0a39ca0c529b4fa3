"""A test class's emulated fleet attested by several verifier processes
that share one PostgreSQL database (and split the nodes with tooz on
Redis): the scale-out and attestation-log stories.

The fleet is enrolled round-robin through every verifier; the class's
PostgreSQL database and files are dropped when it ends.
"""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
import time
from typing import Any, ClassVar

import requests
import testtools

from trusted_testing import services
from trusted_testing.cluster import LocalCluster
from trusted_testing.fleet import FleetProcess

__all__ = ["SharedDbFleetCase"]


class SharedDbFleetCase(testtools.TestCase):
    """Set by subclasses: ``NAME`` (the skip message's and the group's
    prefix), ``VERIFIERS``, ``NODES``, ``INTERVAL`` (seconds between
    quotes), ``MEMBERSHIP_TIMEOUT`` (tooz) and ``VERIFIER_OPTIONS`` (more
    ``[verifier]`` options)."""

    NAME: ClassVar[str] = "shared-db"
    VERIFIERS: ClassVar[int] = 2
    NODES: ClassVar[int] = 6
    INTERVAL: ClassVar[float] = 2.0
    MEMBERSHIP_TIMEOUT: ClassVar[float] = 2.0
    VERIFIER_OPTIONS: ClassVar[dict[str, Any]] = {}

    cluster: ClassVar[LocalCluster]
    fleet: ClassVar[FleetProcess]
    tmp: ClassVar[str]
    db_url: ClassVar[str]
    db_name: ClassVar[str]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        missing = services.missing_services()
        if missing:
            raise cls.skipException(
                f"{cls.NAME} needs " + "; ".join(missing) + " -- not running here"
            )
        cls.tmp = tempfile.mkdtemp(prefix=f"{cls.NAME}-")
        cls.db_url, cls.db_name = services.scratch_postgres()
        cls.cluster = LocalCluster(
            os.path.join(cls.tmp, "cluster"),
            nodes=0,
            interval=cls.INTERVAL,
            verifiers=cls.VERIFIERS,
            database_url=cls.db_url,
            verifier_options={
                "coordination_url": services.redis_coordination_url(
                    cls.MEMBERSHIP_TIMEOUT
                ),
                # Other checkouts may run this test on the same Redis at once.
                "coordination_group": f"{cls.NAME}-{os.getpid()}-{time.time_ns()}",
                "sync_interval": 0.2,
                **cls.VERIFIER_OPTIONS,
            },
        )
        cls.fleet = FleetProcess(cls.NODES, "", cls.cluster.pki, cls.tmp)
        try:
            cls.cluster.start()
            cls.fleet.registrar_url = cls.cluster.registrar_url
            cls.fleet.start()
            cls._enrol_all()
        except Exception:
            cls._cleanup()
            raise

    @classmethod
    def _cleanup(cls) -> None:
        try:
            cls.fleet.stop()
            cls.cluster.stop()
        finally:
            services.drop_postgres(cls.db_name)
            shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def tearDownClass(cls) -> None:
        cls._cleanup()
        super().tearDownClass()

    @classmethod
    def _session(cls, who: str = "tenant") -> requests.Session:
        """An HTTPS session with the certificate of ``who`` (tenant,
        operator...)."""
        session = requests.Session()
        session.trust_env = False
        session.cert = (
            cls.cluster.pki_file(f"{who}.pem"),
            cls.cluster.pki_file(f"{who}-key.pem"),
        )
        session.verify = cls.cluster.pki_file("ca.pem")
        return session

    @classmethod
    def _enrol_all(cls) -> None:
        """Enrol every node of the fleet, through each verifier in turn
        (any verifier may enrol: they share the database)."""
        session = cls._session()
        policy = {"pcrs": {"16": [cls.fleet.pcr16]}}
        for i, uuid in enumerate(cls.fleet.uuids):
            url = cls.cluster.verifier_urls[i % cls.VERIFIERS]
            body: dict[str, Any] = {
                "uuid": uuid,
                "v": base64.b64encode(os.urandom(32)).decode(),
                "u_commitment": base64.b64encode(bytes(32)).decode(),
                "policy": policy,
            }
            resp = session.post(f"{url}/v1/nodes", json=body, timeout=10)
            assert resp.status_code == 201, resp.text
