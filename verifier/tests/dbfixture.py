"""A fresh database for a test: SQLite in a temporary directory, migrated
to the newest schema, disposed and removed at clean-up."""

from __future__ import annotations

import os
import tempfile

import fixtures
import sqlalchemy as sa

from verifier.db import make_engine, upgrade

__all__ = ["SqliteDatabase"]


class SqliteDatabase(fixtures.Fixture):
    """``self.engine``: an upgraded SQLite database of its own.

    Args:
        name: the database file's name in the temporary directory.
    """

    engine: sa.Engine

    def __init__(self, name: str = "r.db") -> None:
        super().__init__()
        self._name = name

    def _setUp(self) -> None:
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.engine = make_engine("sqlite:///" + os.path.join(tmp.name, self._name))
        self.addCleanup(self.engine.dispose)
        upgrade(self.engine)
