"""Storage: SQLAlchemy 2 models, alembic migrations, engine set-up.

SQLite needs nothing more; PostgreSQL needs the ``postgresql`` extra
(psycopg 3) and MySQL/MariaDB the ``mysql`` extra (PyMySQL). A URL without
a driver (``postgresql://``, ``mysql://``, ``mariadb://``) gets the one
those extras install.
"""

from __future__ import annotations

import hashlib
import os

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.exc import ArgumentError

from verifier.common import extras
from verifier.db.models import (
    Base,
    Host,
    HostCa,
    InstancePlacement,
    LogEntryRow,
    LogHead,
    LogNode,
    Node,
    OutboxEvent,
    PendingRegistration,
    ProviderEk,
    RegisteredAgent,
    StoredPolicy,
)
from verifier.exceptions import ConfigError

__all__ = [
    "DRIVERS",
    "Base",
    "Host",
    "HostCa",
    "InstancePlacement",
    "LogEntryRow",
    "LogHead",
    "LogNode",
    "Node",
    "OutboxEvent",
    "PendingRegistration",
    "ProviderEk",
    "RegisteredAgent",
    "StoredPolicy",
    "database_url",
    "make_engine",
    "upgrade",
]

_MIGRATIONS = os.path.join(os.path.dirname(__file__), "migrations")

#: Dialect -> the driver its extra installs (``postgresql``, ``mysql``).
DRIVERS = {"postgresql": "psycopg", "mysql": "pymysql", "mariadb": "pymysql"}


def database_url(url: str) -> sa.URL:
    """``url`` parsed, with our extras' driver when it names none.

    Raises:
        ConfigError: not an SQLAlchemy URL.
    """
    try:
        parsed = sa.make_url(url)
    except ArgumentError as exc:
        raise ConfigError(f"database connection: {exc}")
    driver = DRIVERS.get(parsed.drivername)
    if driver is not None:
        parsed = parsed.set(drivername=f"{parsed.drivername}+{driver}")
    return parsed


def make_engine(url: str) -> sa.Engine:
    """An engine for ``url`` whose errors never show a statement's
    parameters; SQLite gets WAL and a busy timeout and its directory is
    created.

    Raises:
        ConfigError: not an SQLAlchemy URL, or its driver is not installed
            (the message names the extra).
    """
    if url.startswith("sqlite:///") and not url.endswith(":memory:"):
        path = url[len("sqlite:///") :]
        if os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
    parsed = database_url(url)
    try:
        # an error's text never carries a statement's parameters (a node's
        # V share, a registration's secrets) into a log
        engine = sa.create_engine(parsed, hide_parameters=True)
    except ImportError as exc:
        where = parsed.render_as_string(hide_password=True)
        raise ConfigError(f"database connection {where}: {extras.explain(exc)}")
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=5000")
            cur.close()

    return engine


#: Key of the PostgreSQL advisory lock held around the migrations (any
#: fixed 64-bit number; advisory locks are per database).
_PG_MIGRATION_LOCK = 0x7472757374656443  # "trustedC"
#: How long a process waits for another one's migrations on MySQL/MariaDB
#: (PostgreSQL waits as long as the other holds the lock).
MIGRATION_LOCK_TIMEOUT = 600


def upgrade(engine: sa.Engine) -> None:
    """Bring the schema to the newest alembic revision.

    Several processes of one deployment (verifiers, the registrar) may start
    at once on one database: the upgrade runs under a lock of that database
    (a transaction-level advisory lock on PostgreSQL, ``GET_LOCK`` on
    MySQL/MariaDB), so the first migrates and the others then find the
    schema at head, instead of racing to create the same tables (the loser
    failed with a unique violation on ``alembic_version`` and did not start).

    Raises:
        ConfigError: another process held the MySQL/MariaDB lock for
            :data:`MIGRATION_LOCK_TIMEOUT` seconds.
    """
    cfg = Config()
    cfg.set_main_option("script_location", _MIGRATIONS)
    with engine.begin() as connection:
        name = engine.dialect.name
        if name == "postgresql":  # released at commit, with the DDL
            connection.execute(
                sa.text("SELECT pg_advisory_xact_lock(:key)"),
                {"key": _PG_MIGRATION_LOCK},
            )
        elif name in ("mysql", "mariadb"):
            _mysql_lock(connection)
        try:
            cfg.attributes["connection"] = connection
            command.upgrade(cfg, "head")
        finally:
            if name in ("mysql", "mariadb"):  # DDL commits as it goes there
                connection.execute(
                    sa.text("SELECT RELEASE_LOCK(:name)"),
                    {"name": _mysql_lock_name(connection)},
                )


def _mysql_lock_name(connection: sa.Connection) -> str:
    # GET_LOCK names are server-wide (64 characters at most): one per database
    database = connection.execute(sa.text("SELECT DATABASE()")).scalar_one()
    return "trusted-migrate-" + hashlib.sha256(str(database).encode()).hexdigest()[:40]


def _mysql_lock(connection: sa.Connection) -> None:
    got = connection.execute(
        sa.text("SELECT GET_LOCK(:name, :timeout)"),
        {"name": _mysql_lock_name(connection), "timeout": MIGRATION_LOCK_TIMEOUT},
    ).scalar_one()
    if got != 1:
        raise ConfigError(
            "database migrations: another process held the migration lock "
            f"for {MIGRATION_LOCK_TIMEOUT} s"
        )
