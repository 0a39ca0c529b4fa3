"""The upgrade of doc/source/admin/upgrade.rst, from the previous release's
code to this checkout's, on a running deployment.

No release is tagged yet; the previous one is :data:`PREVIOUS` (the main
branch before the TPM counters became 64-bit, whose schema head is
``0015_host_trust``). Its source comes from this clone's history
(``git archive``) and runs with this virtualenv's libraries
(``PYTHONPATH`` first): its registrar and verifier populate their SQLite
databases at 0015 with a node attested by an agent of the previous
release and one attested by an agent of this release. Then the services
are replaced by this checkout's (the agents keep running): the verifier
migrates to head at start and both nodes keep being quoted and judged
under their enrolled policy. That is what the upgrade notes promise: the
agents' API (``/v1``) is unchanged, so agents need no upgrade at the same
time as the services.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from typing import Any

import fixtures
import testtools

import trusted_testing.cluster as cluster_mod
from trusted_testing.cluster import PCR, LocalCluster, NodeHandle, wait_until
from trusted_testing.e2e import Http
from verifier.protocol import PcrPolicy

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
#: The previous release: main at the start of issue 33's operations work.
PREVIOUS = "371104487a4078e27960ea0c01c4bc18ecffd18c"
#: Its schema head (verifier and registrar share one alembic history).
PREVIOUS_HEAD = "0015_host_trust"
PAYLOAD = b"#!/bin/sh\necho upgraded\n"


def _has_previous() -> bool:
    if shutil.which("git") is None:
        return False
    found = subprocess.run(
        ["git", "-C", REPO, "cat-file", "-e", f"{PREVIOUS}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    return found.returncode == 0


def _schema(path: str) -> str:
    with sqlite3.connect(path) as conn:
        return str(
            conn.execute("SELECT version_num FROM alembic_version").fetchone()[0]
        )


@testtools.skipUnless(
    _has_previous(), f"needs git and commit {PREVIOUS} (a full clone)"
)
class UpgradeTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.tmp = tempfile.mkdtemp(prefix="trusted-upgrade-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.old = os.path.join(self.tmp, "previous")
        os.makedirs(self.old)
        archive = subprocess.run(
            f"git -C {REPO} archive {PREVIOUS} | tar -x -C {self.old}",
            shell=True,
            capture_output=True,
            text=True,
            check=False,
        )
        self.assertEqual(0, archive.returncode, archive.stderr)
        self.old_bin = os.path.join(self.tmp, "previous-bin")
        os.makedirs(self.old_bin)
        for name in ("trusted-registrar", "trusted-verifier", "trusted-agent"):
            path = os.path.join(self.old_bin, name)
            with open(path, "w") as f:
                f.write(
                    "#!/bin/sh\n"
                    f"PYTHONPATH={self.old} exec {sys.executable} -P -c "
                    "'import sys; from verifier.common.launch import launch; "
                    f'sys.exit(launch("{name}"))\' "$@"\n'
                )
            os.chmod(path, 0o755)
        self.cluster = LocalCluster(
            os.path.join(self.tmp, "cluster"), nodes=2, interval=0.5
        )
        self.addCleanup(self.cluster.stop)

    def previous_release(self) -> fixtures.MonkeyPatch:
        """While in use, the cluster starts the previous release's scripts."""
        return fixtures.MonkeyPatch(
            "trusted_testing.cluster._script",
            lambda name: os.path.join(self.old_bin, name),
        )

    def tenant_call(self, method: str, *args: Any) -> Any:
        async def call() -> Any:
            tenant = self.cluster.tenant()
            try:
                return await getattr(tenant, method)(*args)
            finally:
                await tenant.close()

        return asyncio.run(call())

    def wait_state(
        self, node: NodeHandle, state: str, quotes: int = 0
    ) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.cluster.node_status(node.uuid)
            if (
                status
                and status["state"] == state
                and status["quotes_verified"] >= quotes
            ):
                return status
            return None

        found = wait_until(reached, 60, 0.3)
        self.assertTrue(found, self.cluster.node_status(node.uuid))
        return dict(found)

    def test_previous_release_database_and_agent_upgrade(self) -> None:
        self.assertEqual(PREVIOUS_HEAD, self.head(self.old))
        with self.previous_release():
            self.cluster.start_services()
            old_agent, new_agent = self.cluster.nodes
            self.cluster.start_agent(old_agent)
        self.cluster.start_agent(new_agent)  # this release's agent
        http = Http(self.cluster)
        for node in (old_agent, new_agent):
            registered = wait_until(
                lambda n=node: (
                    http.call(
                        "GET", f"{self.cluster.registrar_url}/v1/agents/{n.uuid}"
                    ).status_code
                    == 200
                ),
                60,
            )
            self.assertTrue(registered, node.log)
        good = PcrPolicy.from_dict({"pcrs": {str(PCR): [self.cluster.good_pcr_hex()]}})
        for node in (old_agent, new_agent):
            self.tenant_call("enrol", node.uuid, PAYLOAD, good)
            self.wait_state(node, "attested", 2)
        verifier_db = os.path.join(self.cluster.workdir, "verifier.sqlite")
        registrar_db = os.path.join(self.cluster.workdir, "registrar.sqlite")
        # the previous release's services made and filled these
        self.assertEqual(PREVIOUS_HEAD, _schema(verifier_db))
        self.assertEqual(PREVIOUS_HEAD, _schema(registrar_db))
        before = {
            n.uuid: self.cluster.node_status(n.uuid) for n in (old_agent, new_agent)
        }

        # the upgrade: registrar, then verifier, this release's; agents run on
        for name in ("verifier", "registrar"):
            proc = self.cluster.procs[name]
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        # (the previous release's fixture is gone: this checkout's scripts)
        self.assertEqual(
            os.path.dirname(sys.executable),
            os.path.dirname(cluster_mod._script("trusted-verifier")),
        )
        self.cluster._start_registrar()
        self.cluster.start_verifier(0)
        head = self.head(REPO)
        self.assertNotEqual(PREVIOUS_HEAD, head)
        self.assertEqual(head, _schema(verifier_db))
        self.assertEqual(head, _schema(registrar_db))

        for node in (old_agent, new_agent):
            after = self.wait_state(
                node, "attested", before[node.uuid]["quotes_verified"] + 3
            )
            self.assertEqual(before[node.uuid]["policy"], after["policy"])
        # the previous release's agent is judged under its enrolled policy
        self.cluster.tamper(old_agent)
        revoked = self.wait_state(old_agent, "revoked")
        self.assertRegex(str(revoked["failure_reason"]), r"^pcr_policy")
        self.assertEqual("attested", self.cluster.node_status(new_agent.uuid)["state"])

    @staticmethod
    def head(root: str) -> str:
        """The alembic head of the source tree at ``root``."""
        from alembic.config import Config
        from alembic.script import ScriptDirectory

        cfg = Config()
        cfg.set_main_option(
            "script_location", os.path.join(root, "verifier", "db", "migrations")
        )
        found = ScriptDirectory.from_config(cfg).get_current_head()
        assert found is not None
        return found
