"""Several processes of one deployment (verifiers, the registrar) starting
at once on one fresh database each run the migrations: all of them must
come up, on a real PostgreSQL and a real MariaDB. Before the migration
lock, the processes raced to create the same tables and all but one failed
(PostgreSQL: unique violation on ``alembic_version``'s type; MariaDB: table
already exists)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
import testtools

from trusted_testing import services

PROCESSES = 3


def _migrate(url: str, gate: Any, results: Any) -> None:
    """One process: connect, wait for the others, then upgrade."""
    from verifier.db import make_engine, upgrade

    engine = make_engine(url)
    with engine.connect():  # connected before the gate: start together
        pass
    gate.wait(60)
    try:
        upgrade(engine)
        results.put("ok")
    except Exception as exc:  # reported to the test, which names it
        results.put(f"{type(exc).__name__}: {exc}"[:300])
    finally:
        engine.dispose()


class ConcurrentMigrationTest(testtools.TestCase):
    def _race(self, url: str) -> list[str]:
        ctx = multiprocessing.get_context("spawn")  # a process, as in production
        gate, results = ctx.Barrier(PROCESSES), ctx.Queue()
        procs = [
            ctx.Process(target=_migrate, args=(url, gate, results))
            for _ in range(PROCESSES)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            self.addCleanup(proc.kill)
        outcomes = [results.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(30)
        return outcomes

    def _assert_at_head(self, url: str) -> None:
        from verifier.db import make_engine
        from verifier.db.models import Base

        engine = make_engine(url)
        self.addCleanup(engine.dispose)
        self.assertEqual(
            set(Base.metadata.tables) | {"alembic_version"},
            set(sa.inspect(engine).get_table_names()),
        )
        with engine.connect() as conn:
            versions = conn.execute(sa.text("SELECT version_num FROM alembic_version"))
            self.assertEqual(1, len(versions.all()))

    def _scratch(
        self, missing: str | None, make: Callable[[], tuple[str, str]], drop: Any
    ) -> str:
        if missing:
            self.skipTest(f"needs {missing}")
        url, name = make()
        self.addCleanup(drop, name)
        return url

    def test_processes_starting_at_once_all_migrate_on_postgresql(self) -> None:
        missing = services.missing_services()
        url = self._scratch(
            "; ".join(missing) if missing else None,
            services.scratch_postgres,
            services.drop_postgres,
        )
        self.assertEqual(["ok"] * PROCESSES, self._race(url))
        self._assert_at_head(url)

    def test_processes_starting_at_once_all_migrate_on_mariadb(self) -> None:
        url = self._scratch(
            services.missing_mariadb(),
            services.scratch_mariadb,
            services.drop_mariadb,
        )
        self.assertEqual(["ok"] * PROCESSES, self._race(url))
        self._assert_at_head(url)
