"""The verifier's database on a real MariaDB, from the bare ``mysql://`` URL
an operator writes (the ``mysql`` extra's PyMySQL is picked for it): the
migrations give exactly the models' schema, and a runtime policy larger
than MySQL's 64 KiB BLOB is stored and read back whole."""

from __future__ import annotations

import sqlalchemy as sa
import testtools
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from trusted_testing import services
from verifier.attest.policies import PolicyStore
from verifier.db import make_engine, upgrade
from verifier.db.models import Base


class MariaDbTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        missing = services.missing_mariadb()
        if missing:
            self.skipTest(f"needs {missing}")
        url, name = services.scratch_mariadb()
        self.addCleanup(services.drop_mariadb, name)
        self.engine = make_engine(url)
        self.addCleanup(self.engine.dispose)

    def test_bare_mysql_url_uses_pymysql(self) -> None:
        self.assertEqual("mysql+pymysql", self.engine.url.drivername)
        with self.engine.connect() as conn:
            version = conn.execute(sa.text("SELECT VERSION()")).scalar_one()
        self.assertIn("MariaDB", version)

    def test_migrations_give_the_models_schema(self) -> None:
        upgrade(self.engine)
        with self.engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"compare_type": True, "compare_server_default": True}
            )
            self.assertEqual([], list(compare_metadata(context, Base.metadata)))
        self.assertEqual(
            set(Base.metadata.tables) | {"alembic_version"},
            set(sa.inspect(self.engine).get_table_names()),
        )

    def test_policy_over_64_kib_round_trips(self) -> None:
        upgrade(self.engine)
        digests = {f"/usr/lib/f{i:05d}": [f"sha256:{i:064x}"] for i in range(2000)}
        store = PolicyStore(self.engine)
        meta, new = store.add(
            "runtime", {"name": "big", "version": 1, "digests": digests}
        )
        self.assertTrue(new)
        self.assertEqual(2000, meta["entries"])
        with self.engine.connect() as conn:
            size = conn.execute(sa.text("SELECT LENGTH(body) FROM verifier_policies"))
            self.assertGreater(size.scalar_one(), 64 * 1024)
        fresh = PolicyStore(self.engine)  # no cache: read from MariaDB
        self.assertEqual(digests, fresh.get("runtime", "big@1")["policy"]["digests"])
