"""The alembic migrations produce exactly the schema of the models."""

from __future__ import annotations

import json
import os
import tempfile

import sqlalchemy as sa
import testtools
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from verifier.db import _MIGRATIONS, make_engine, upgrade
from verifier.db.models import Base


def _head() -> str:
    cfg = Config()
    cfg.set_main_option("script_location", _MIGRATIONS)
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    return head


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
            self.assertEqual([_head()], [r[0] for r in version])

    def test_upgrade_from_0001_keeps_nodes(self) -> None:
        cfg = Config()
        cfg.set_main_option("script_location", _MIGRATIONS)
        with self.engine.begin() as connection:
            cfg.attributes["connection"] = connection
            command.upgrade(cfg, "0001")
            connection.execute(
                sa.text(
                    "INSERT INTO verifier_nodes (uuid, state, policy, v_share,"
                    " ak_public, tls_cert, host, port, quotes_verified, v_released,"
                    " created_at, updated_at) VALUES ('n', 'attested', '{}', x'00',"
                    " x'00', 'c', 'h', 1, 3, 1, 1.0, 1.0)"
                )
            )
        upgrade(self.engine)
        self.assert_schema_matches_models()
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.text("SELECT state, quotes_verified, ima_count FROM verifier_nodes")
            ).one()
        self.assertEqual(("attested", 3, None), tuple(row))

    def test_upgrade_to_0005_gives_old_rows_no_project(self) -> None:
        cfg = Config()
        cfg.set_main_option("script_location", _MIGRATIONS)
        with self.engine.begin() as connection:
            cfg.attributes["connection"] = connection
            command.upgrade(cfg, "0004")
            connection.execute(
                sa.text(
                    "INSERT INTO verifier_nodes (uuid, state, policy, v_share,"
                    " ak_public, tls_cert, host, port, quotes_verified, v_released,"
                    " created_at, updated_at, mb_policy) VALUES ('n', 'attested',"
                    " '{}', x'00', x'00', 'c', 'h', 1, 3, 1, 1.0, 1.0, 'd')"
                )
            )
            connection.execute(
                sa.text(
                    "INSERT INTO verifier_policies (digest, kind, name, version,"
                    " body, entries, created_at) VALUES ('d', 'measured-boot',"
                    " 'fw', 1, x'7b7d', 0, 1.0)"
                )
            )
            connection.execute(
                sa.text(
                    "INSERT INTO verifier_outbox (id, node_uuid, body, created_at,"
                    " attempts) VALUES ('e', 'n', '{}', 1.0, 0)"
                )
            )
        upgrade(self.engine)
        self.assert_schema_matches_models()
        with self.engine.connect() as conn:
            for table, key in (
                ("verifier_nodes", "uuid"),
                ("verifier_policies", "name"),
                ("verifier_outbox", "id"),
            ):
                rows = conn.execute(sa.text(f"SELECT {key}, project_id FROM {table}"))
                self.assertEqual(1, len(list(rows)), table)
            rows = conn.execute(
                sa.text("SELECT project_id, digest, name FROM verifier_policies")
            )
            self.assertEqual([("", "d", "fw")], [tuple(r) for r in rows])
            nodes = conn.execute(
                sa.text("SELECT project_id, mb_policy FROM verifier_nodes")
            )
            self.assertEqual([("", "d")], [tuple(r) for r in nodes])

    def test_downgrade_from_0005_keeps_policies(self) -> None:
        upgrade(self.engine)
        with self.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO verifier_policies (project_id, digest, kind, name,"
                    " version, body, entries, created_at) VALUES"
                    " ('a', 'd', 'measured-boot', 'fw', 1, x'7b7d', 0, 1.0),"
                    " ('b', 'd', 'measured-boot', 'fw', 1, x'7b7d', 0, 1.0)"
                )
            )
        cfg = Config()
        cfg.set_main_option("script_location", _MIGRATIONS)
        with self.engine.begin() as connection:
            cfg.attributes["connection"] = connection
            command.downgrade(cfg, "0004")
        with self.engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT digest, name FROM verifier_policies"))
            self.assertEqual([("d", "fw")], [tuple(r) for r in rows])

    def test_upgrade_to_0006_gives_old_nodes_no_commitment(self) -> None:
        cfg = Config()
        cfg.set_main_option("script_location", _MIGRATIONS)
        with self.engine.begin() as connection:
            cfg.attributes["connection"] = connection
            command.upgrade(cfg, "0005")
            connection.execute(
                sa.text(
                    "INSERT INTO verifier_nodes (uuid, state, policy, v_share,"
                    " ak_public, tls_cert, host, port, quotes_verified, v_released,"
                    " created_at, updated_at, project_id) VALUES ('n', 'attested',"
                    " '{}', x'00', x'00', 'c', 'h', 1, 3, 1, 1.0, 1.0, 'p')"
                )
            )
        upgrade(self.engine)
        self.assert_schema_matches_models()
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT uuid, project_id, u_commitment FROM verifier_nodes")
            )
            self.assertEqual([("n", "p", None)], [tuple(r) for r in rows])
        with self.engine.begin() as connection:
            cfg.attributes["connection"] = connection
            command.downgrade(cfg, "0005")
        with self.engine.connect() as conn:
            count = conn.execute(sa.text("SELECT count(*) FROM verifier_nodes"))
            self.assertEqual(1, count.scalar_one())

    def test_upgrade_to_0008_keeps_provider_eks_and_downgrade_drops_host_cas(
        self,
    ) -> None:
        cfg = Config()
        cfg.set_main_option("script_location", _MIGRATIONS)
        with self.engine.begin() as connection:
            cfg.attributes["connection"] = connection
            command.upgrade(cfg, "0005")
            connection.execute(
                sa.text(
                    "INSERT INTO registrar_provider_eks (uuid, ek_public, provider,"
                    " created_at) VALUES ('u', x'00', 'p', 1.0)"
                )
            )
        upgrade(self.engine)
        self.assert_schema_matches_models()
        with self.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO registrar_host_cas (host, ca_pem, provider,"
                    " updated_at) VALUES ('compute-a', 'pem', 'p', 1.0)"
                )
            )
            conn.execute(
                sa.text(
                    "INSERT INTO registrar_instance_hosts (uuid, host, origin_host,"
                    " provider, updated_at) VALUES ('u', 'b', 'a', 'p', 1.0)"
                )
            )
            count = conn.execute(sa.text("SELECT count(*) FROM registrar_provider_eks"))
            self.assertEqual(1, count.scalar_one())
        with self.engine.begin() as connection:
            cfg.attributes["connection"] = connection
            command.downgrade(cfg, "0007")
        tables = set(sa.inspect(self.engine).get_table_names())
        self.assertNotIn("registrar_host_cas", tables)
        self.assertNotIn("registrar_instance_hosts", tables)
        self.assertIn("registrar_provider_eks", tables)

    def test_upgrade_to_0015_gives_enrolled_hosts_no_trust_record(self) -> None:
        cfg = Config()
        cfg.set_main_option("script_location", _MIGRATIONS)
        with self.engine.begin() as connection:
            cfg.attributes["connection"] = connection
            command.upgrade(cfg, "0013")
            connection.execute(
                sa.text(
                    "INSERT INTO registrar_host_cas (host, ca_pem, provider,"
                    " updated_at) VALUES ('compute-a', 'pem', 'p', 1.0)"
                )
            )
        upgrade(self.engine)
        self.assert_schema_matches_models()
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.text(
                    "SELECT ca_pem, trusted, trust_ca_sha256, trust_as_of"
                    " FROM registrar_host_cas"
                )
            ).one()
        self.assertEqual(("pem", None, None, None), tuple(row))
        with self.engine.begin() as connection:
            cfg.attributes["connection"] = connection
            command.downgrade(cfg, "0014_hosts")
        columns = {
            c["name"] for c in sa.inspect(self.engine).get_columns("registrar_host_cas")
        }
        self.assertEqual({"host", "ca_pem", "provider", "updated_at"}, columns)

    def test_upgrade_to_0013_fills_type_and_reason_from_the_body(self) -> None:
        cfg = Config()
        cfg.set_main_option("script_location", _MIGRATIONS)
        bodies = {
            "a": {"event": {"type": "node.unreachable", "reason": "timeout"}},
            "b": {"event": {"type": "node.revoked", "reason": "r" * 65}},
            "c": "not an event",
        }
        with self.engine.begin() as connection:
            cfg.attributes["connection"] = connection
            command.upgrade(cfg, "0012")
            for row_id, body in bodies.items():
                connection.execute(
                    sa.text(
                        "INSERT INTO verifier_outbox (id, node_uuid, project_id,"
                        " body, created_at, attempts) VALUES (:i, 'n', 'p', :b,"
                        " 1.0, 0)"
                    ),
                    {"i": row_id, "b": json.dumps(body)},
                )
        upgrade(self.engine)
        self.assert_schema_matches_models()
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT id, type, reason FROM verifier_outbox ORDER BY id")
            )
            self.assertEqual(
                [
                    ("a", "node.unreachable", "timeout"),
                    ("b", "node.revoked", None),  # too long to query: body only
                    ("c", None, None),
                ],
                [tuple(r) for r in rows],
            )

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
