"""Storage: SQLAlchemy 2 models, alembic migrations, engine set-up."""

from __future__ import annotations

import os

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import event

from verifier.db.models import (
    Base,
    Node,
    OutboxEvent,
    ProviderEk,
    RegisteredAgent,
    StoredPolicy,
)

__all__ = [
    "Base",
    "Node",
    "OutboxEvent",
    "ProviderEk",
    "RegisteredAgent",
    "StoredPolicy",
    "make_engine",
    "upgrade",
]

_MIGRATIONS = os.path.join(os.path.dirname(__file__), "migrations")


def make_engine(url: str) -> sa.Engine:
    """An engine for ``url``; SQLite gets WAL and a busy timeout and its
    directory is created."""
    if url.startswith("sqlite:///") and not url.endswith(":memory:"):
        path = url[len("sqlite:///") :]
        if os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
    engine = sa.create_engine(url)
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=5000")
            cur.close()

    return engine


def upgrade(engine: sa.Engine) -> None:
    """Bring the schema to the newest alembic revision."""
    cfg = Config()
    cfg.set_main_option("script_location", _MIGRATIONS)
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, "head")
