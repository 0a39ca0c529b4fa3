"""Backup and restore as doc/source/admin/backup.rst writes it, on a running
deployment (real registrar, verifier and agents on swtpm), with SQLite and
with PostgreSQL.

The page's four command blocks (``sqlite-backup``, ``sqlite-restore``,
``postgresql-backup``, ``postgresql-restore``) are read from the page and
run line by line with ``bash``, with the page's paths, server and database
names replaced by the test's; ``systemctl`` and ``chown`` lines are what
the test does itself (it stops and starts the service processes; it owns
the files). The backup is taken while the services run; the restore goes
into new database files (new databases on PostgreSQL) for new registrar and
verifier processes, and the agents keep running throughout.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from typing import ClassVar

import testtools

from trusted_testing import services
from trusted_testing.cluster import PCR
from trusted_testing.cluster_case import ClusterTestCase
from trusted_testing.docpages import named_block
from verifier.protocol import PcrPolicy

PAYLOAD = b"#!/bin/sh\necho restored\n"


def page_block(name: str) -> list[str]:
    """The command lines of the page's ``code-block`` named ``name``."""
    return named_block("admin/backup.rst", name)


class _BackupRestore(ClusterTestCase):
    """The story for one database backend; subclasses say which."""

    node_count = 2
    interval = 0.5
    wait_timeout = 40.0
    #: the page's block names (without -backup/-restore)
    backend: ClassVar[str]

    @classmethod
    def set_up_cluster(cls) -> None:
        cls.good = PcrPolicy.from_dict(
            {"pcrs": {str(PCR): [cls.cluster.good_pcr_hex()]}}
        )
        cls.backups = os.path.join(cls.tmp, "backups")

    # -- the page's commands ------------------------------------------------

    def replacements(self, restoring: bool) -> list[tuple[str, str]]:
        """(page text, the test's) pairs, longest first."""
        return [
            ("/var/backups/trusted-cloud", self.backups),
            ("/var/lib/trusted-cloud", self.cluster.workdir),
            ("/etc/trusted-cloud", self.cluster.workdir),
        ]

    def run_block(self, name: str, restoring: bool = False) -> None:
        for line in page_block(name):
            if line.startswith(("systemctl ", "chown ")):
                continue  # the test stops/starts the processes and owns the files
            for page_text, ours in self.replacements(restoring):
                line = line.replace(page_text, ours)
            done = subprocess.run(
                ["bash", "-euc", line],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            self.assertEqual(0, done.returncode, f"{line}\n{done.stdout}{done.stderr}")
            if "integrity_check" in line:
                self.assertEqual("ok\n", done.stdout)

    def stop_services(self) -> None:
        for name in ("verifier", "registrar"):
            proc = self.cluster.procs[name]
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)

    def start_services(self) -> None:
        self.cluster._start_registrar()
        self.cluster.start_verifier(0)

    def lose_databases(self) -> None:
        """What the restore replaces is gone (the backend's part)."""

    # -- the story ----------------------------------------------------------

    def signing_key(self) -> bytes:
        r = self.http.call("GET", f"{self.cluster.verifier_url}/v1/signing-key")
        self.assertEqual(200, r.status_code, r.text)
        return r.content

    def check_restored_deployment_resumes_attesting_its_nodes(self) -> None:
        good, bad = self.cluster.nodes
        for node in (good, bad):
            self.run_async(self.tenant.enrol(node.uuid, PAYLOAD, self.good))
            self.wait_for(node.uuid, lambda s: s["state"] == "attested")
        self.cluster.tamper(bad)
        self.wait_for(bad.uuid, lambda s: s["state"] == "revoked")
        key = self.signing_key()
        enrolled_policy = self.status(good.uuid)["policy"]
        self.assertIn(str(PCR), str(enrolled_policy))

        # the backup, with the services running and quoting
        self.run_block(f"{self.backend}-backup")
        quoted = self.status(good.uuid)["quotes_verified"]
        # a change after the backup, which the restore undoes
        self.run_async(self.tenant.delete(bad.uuid))

        self.stop_services()
        self.lose_databases()
        self.run_block(f"{self.backend}-restore", restoring=True)
        self.start_services()

        # the revoked node is back, still revoked, for its reason; the
        # signing key is the same
        restored = self.status(bad.uuid)
        self.assertEqual("revoked", restored["state"], restored)
        self.assertRegex(str(restored["failure_reason"]), r"^pcr_policy", restored)
        self.assertEqual(key, self.signing_key())
        # the attested one is quoted again by the new verifier, still good
        after = self.wait_for(
            good.uuid,
            lambda s: s["state"] == "attested" and s["quotes_verified"] >= quoted + 3,
        )
        self.assertEqual("attested", after["state"], after)
        self.assertGreaterEqual(after["quotes_verified"], quoted + 3, after)
        self.assertEqual(enrolled_policy, after["policy"])
        # and its restored policy still judges it: tampering revokes it
        self.cluster.tamper(good)
        revoked = self.wait_for(good.uuid, lambda s: s["state"] == "revoked")
        self.assertEqual("revoked", revoked["state"], revoked)
        self.assertRegex(str(revoked["failure_reason"]), r"^pcr_policy", revoked)


class SqliteBackupTest(_BackupRestore):
    prefix = "trusted-backup-sqlite-"
    backend = "sqlite"

    def lose_databases(self) -> None:
        # new files: the old ones (and the signing key) are gone
        for name in ("registrar", "verifier"):
            for suffix in ("", "-wal", "-shm"):
                path = os.path.join(self.cluster.workdir, f"{name}.sqlite{suffix}")
                if os.path.exists(path):
                    os.unlink(path)
        os.unlink(os.path.join(self.cluster.workdir, "event-signing-key.pem"))

    def test_restored_deployment_resumes_attesting_its_nodes(self) -> None:
        self.check_restored_deployment_resumes_attesting_its_nodes()


@testtools.skipIf(
    services.missing_services() != [] or shutil.which("pg_dump") is None,
    "PostgreSQL on 127.0.0.1:5432 and its client tools are needed",
)
class PostgresBackupTest(_BackupRestore):
    prefix = "trusted-backup-pg-"
    backend = "postgresql"
    databases: ClassVar[dict[str, tuple[str, str]]]
    restored: ClassVar[dict[str, tuple[str, str]]]

    @classmethod
    def setUpClass(cls) -> None:
        cls.databases = {
            "registrar": services.scratch_postgres(),
            "verifier": services.scratch_postgres(),
        }
        cls.restored = {}
        cls.registrar_options = {"database_connection": cls.databases["registrar"][0]}
        cls.verifier_options = {"database_connection": cls.databases["verifier"][0]}
        try:
            super().setUpClass()
        except BaseException:
            cls._drop()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            super().tearDownClass()
        finally:
            cls._drop()

    @classmethod
    def _drop(cls) -> None:
        for _, name in [*cls.databases.values(), *cls.restored.values()]:
            services.drop_postgres(name)

    def replacements(self, restoring: bool) -> list[tuple[str, str]]:
        pairs = []
        for role in ("registrar", "verifier"):
            url, name = (self.restored if restoring else self.databases)[role]
            libpq = url.replace("postgresql+psycopg://", "postgresql://")
            pairs.append((f"postgresql://trusted@db.example.org/trusted_{role}", libpq))
            pairs.append((f" trusted_{role}", f" {name}"))
        pairs.append(
            (
                "--host=db.example.org --username=trusted",
                "--host=127.0.0.1 --port=5432 --username=postgres",
            )
        )
        return pairs + super().replacements(restoring)

    def lose_databases(self) -> None:
        # fresh, empty databases that the page's createdb makes; the
        # services are configured on them
        for role in ("registrar", "verifier"):
            url, name = services.scratch_postgres()
            services.drop_postgres(name)  # createdb (the page) makes it
            type(self).restored[role] = (url, name)
        self.cluster.registrar_options["database_connection"] = self.restored[
            "registrar"
        ][0]

        self.cluster.verifier_options["database_connection"] = self.restored[
            "verifier"
        ][0]

    def test_restored_deployment_resumes_attesting_its_nodes(self) -> None:
        self.check_restored_deployment_resumes_attesting_its_nodes()
