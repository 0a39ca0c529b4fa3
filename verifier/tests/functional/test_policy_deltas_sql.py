"""Runtime policy deltas on the production databases (issue 28): the store
finds a delta's base, and a base's deltas, from the first bytes of the
stored canonical body (``substr`` of a BLOB/bytea); on a real MariaDB and a
real PostgreSQL a base with a delta over it is listed, loaded composed by a
cold store and refused deletion while the delta stays."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import sqlalchemy as sa
import testtools

from trusted_testing import services
from verifier.attest.policies import PolicyStore
from verifier.db import make_engine, upgrade
from verifier.exceptions import ConflictError
from verifier.protocol.ima import RuntimePolicy

BASE = {
    "name": "web",
    "version": 4,
    # over MySQL's 64 KiB BLOB: the prefix is read from a large body
    "digests": {f"/usr/lib/f{i:05d}": [f"sha256:{i:064x}"] for i in range(2000)},
}


class _DeltaOnSql:
    engine: sa.Engine

    def test_a_delta_over_a_base_on_this_database(self) -> None:
        case: testtools.TestCase = self  # type: ignore[assignment]
        upgrade(self.engine)
        store = PolicyStore(self.engine)
        base, _ = store.add("runtime", BASE, project="p1")
        new = "sha256:" + hashlib.sha256(b"new").hexdigest()
        delta, _ = store.add(
            "runtime",
            {
                "name": "web",
                "version": 5,
                "base": base["digest"],
                "digests": {"/usr/sbin/nginx": [new]},
            },
            project="p1",
        )
        listed = {m["version"]: m["base"] for m in store.list("runtime", "p1")}
        case.assertEqual(
            {4: None, 5: {"name": "web", "version": 4, "digest": base["digest"]}},
            listed,
        )
        cold = PolicyStore(self.engine)
        five = cold.load(delta["digest"])
        assert isinstance(five, RuntimePolicy)
        case.assertIs(cold.load(base["digest"]), five.base)
        case.assertEqual(2001, len(five))
        with case.assertRaises(ConflictError) as ctx:
            store.delete("runtime", "web@4", "p1")
        case.assertIn(delta["digest"], ctx.exception.detail)
        store.delete("runtime", "web@5", "p1")
        store.delete("runtime", "web@4", "p1")
        case.assertEqual([], store.list("runtime", "p1"))


def _database(
    case: testtools.TestCase,
    missing: str | None,
    scratch: Callable[[], tuple[str, str]],
    drop: Callable[[str], None],
) -> sa.Engine:
    if missing:
        case.skipTest(f"needs {missing}")
    url, name = scratch()
    case.addCleanup(drop, name)
    engine = make_engine(url)
    case.addCleanup(engine.dispose)
    return engine


class MariaDbDeltaTest(_DeltaOnSql, testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.engine = _database(
            self,
            services.missing_mariadb(),
            services.scratch_mariadb,
            services.drop_mariadb,
        )


class PostgresDeltaTest(_DeltaOnSql, testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        missing = services.missing_services()
        self.engine = _database(
            self,
            missing[0] if missing and "PostgreSQL" in missing[0] else None,
            services.scratch_postgres,
            services.drop_postgres,
        )
