"""The alembic migrations produce exactly the schema of the models."""

from __future__ import annotations

import os
import tempfile

import sqlalchemy as sa
import testtools
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from verifier.db import make_engine, upgrade
from verifier.db.models import Base


class MigrationTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.path = os.path.join(tmp.name, "sub", "m.db")
        self.engine = make_engine("sqlite:///" + self.path)
        self.addCleanup(self.engine.dispose)

    def diff(self) -> list[object]:
        with self.engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"compare_type": True, "compare_server_default": True}
            )
            return list(compare_metadata(context, Base.metadata))

    def assert_schema_matches_models(self) -> None:
        self.assertEqual([], self.diff())
        inspector = sa.inspect(self.engine)
        expected_tables = set(Base.metadata.tables)
        self.assertEqual(
            expected_tables | {"alembic_version"}, set(inspector.get_table_names())
        )
        for name, table in Base.metadata.tables.items():
            columns = {c["name"]: c for c in inspector.get_columns(name)}
            self.assertEqual(set(table.columns.keys()), set(columns), name)
            for column in table.columns:
                self.assertEqual(
                    column.nullable, columns[column.name]["nullable"], str(column)
                )
            pk = inspector.get_pk_constraint(name)["constrained_columns"]
            self.assertEqual([c.name for c in table.primary_key], pk, name)
            indexed = {tuple(i["column_names"]) for i in inspector.get_indexes(name)}
            expected = {tuple(c.name for c in i.columns) for i in table.indexes}
            self.assertEqual(expected, indexed, name)

    def test_upgrade_empty_database_matches_models(self) -> None:
        self.assertTrue(self.diff())  # an empty database differs
        upgrade(self.engine)
        self.assertTrue(os.path.exists(self.path))
        self.assert_schema_matches_models()
        with self.engine.connect() as conn:
            version = conn.execute(sa.text("SELECT version_num FROM alembic_version"))
            self.assertEqual(["0002_provider_eks"], [r[0] for r in version])

    def test_upgrade_twice_is_harmless(self) -> None:
        upgrade(self.engine)
        with self.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO verifier_outbox (id, node_uuid, body, created_at,"
                    " attempts) VALUES ('e', 'n', '{}', 1.0, 0)"
                )
            )
        upgrade(self.engine)
        self.assert_schema_matches_models()
        with self.engine.connect() as conn:
            count = conn.execute(sa.text("SELECT count(*) FROM verifier_outbox"))
            self.assertEqual(1, count.scalar_one())

    def test_sqlite_pragmas(self) -> None:
        upgrade(self.engine)
        with self.engine.connect() as conn:
            mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar_one()
            timeout = conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one()
        self.assertEqual("wal", mode.lower())
        self.assertEqual(5000, timeout)
