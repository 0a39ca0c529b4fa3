"""Shared SQL databases and coordination backends for scale-out tests and
benchmarks: PostgreSQL, MariaDB and Redis on their standard local ports.

A test that needs them asks :func:`missing_services` (or
:func:`missing_mariadb`), which says exactly what is missing (and how to
start it) instead of failing obscurely.
"""

from __future__ import annotations

import socket
import uuid as uuid_mod

import sqlalchemy as sa

ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
#: MariaDB's root over loopback TCP (Debian's default grants it without a
#: password from 127.0.0.1).
MARIADB_ADMIN_URL = "mysql+pymysql://root@127.0.0.1:3306/"


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def missing_services() -> list[str]:
    """Human-readable list of what is not running (empty: all there)."""
    missing = []
    if not _listening("127.0.0.1", 5432):
        missing.append(
            "PostgreSQL on 127.0.0.1:5432 (apt-get install postgresql; "
            "pg_ctlcluster --skip-systemctl-redirect 15 main start)"
        )
    if not _listening(REDIS_HOST, REDIS_PORT):
        missing.append(
            "Redis on 127.0.0.1:6379 (apt-get install redis-server; "
            "redis-server --daemonize yes)"
        )
    return missing


def scratch_postgres() -> tuple[str, str]:
    """Create a fresh database; returns (SQLAlchemy URL, database name)."""
    name = f"tc_{uuid_mod.uuid4().hex[:12]}"
    engine = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}", name


def drop_postgres(name: str) -> None:
    engine = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


def redis_coordination_url(membership_timeout: float) -> str:
    """A tooz URL on the local Redis with the given membership timeout.

    Each call gets its own key namespace: the Redis is machine-wide, and two
    test runs at once (other worktrees, CI) would otherwise share the group
    ``trusted-verifiers`` and its member ids ``verifier``, ``verifier2``...
    and take each other's nodes.
    """
    return (
        f"redis://{REDIS_HOST}:{REDIS_PORT}?membership_timeout={membership_timeout}"
        f"&timeout=5&namespace=tc-{uuid_mod.uuid4().hex[:12]}"
    )


def missing_mariadb() -> str | None:
    """What to start when MariaDB is not listening on 127.0.0.1:3306."""
    if _listening("127.0.0.1", 3306):
        return None
    return (
        "MariaDB on 127.0.0.1:3306 (apt-get install mariadb-server; "
        "mysqld_safe --bind-address=127.0.0.1 &)"
    )


def scratch_mariadb() -> tuple[str, str]:
    """Create a fresh MariaDB database; returns (bare ``mysql://`` URL as an
    operator writes it, database name). Needs PyMySQL (the mysql extra)."""
    name = f"tc_{uuid_mod.uuid4().hex[:12]}"
    engine = sa.create_engine(MARIADB_ADMIN_URL)
    with engine.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE `{name}`"))
    engine.dispose()
    return f"mysql://root@127.0.0.1:3306/{name}", name


def drop_mariadb(name: str) -> None:
    engine = sa.create_engine(MARIADB_ADMIN_URL)
    with engine.connect() as conn:
        conn.execute(sa.text(f"DROP DATABASE IF EXISTS `{name}`"))
    engine.dispose()
