"""Database URLs: a URL without a driver gets the one our extras install,
and a driver that is not installed is a configuration error naming the
extra, not a traceback."""

from __future__ import annotations

import sys
from unittest import mock

import testtools

from verifier.db import database_url, make_engine
from verifier.exceptions import ConfigError


class DatabaseUrlTest(testtools.TestCase):
    def test_bare_dialects_get_the_extras_drivers(self) -> None:
        for url, driver in (
            ("postgresql://u@127.0.0.1/db", "postgresql+psycopg"),
            ("mysql://u@127.0.0.1/db", "mysql+pymysql"),
            ("mariadb://u@127.0.0.1/db", "mariadb+pymysql"),
        ):
            self.assertEqual(driver, database_url(url).drivername, url)

    def test_explicit_driver_and_sqlite_are_kept(self) -> None:
        for url in ("postgresql+psycopg2://u@h/db", "sqlite:///x.db", "sqlite://"):
            self.assertEqual(url.split(":", 1)[0], database_url(url).drivername, url)

    def test_not_a_url_is_a_config_error(self) -> None:
        exc = self.assertRaises(ConfigError, make_engine, "no url here")
        self.assertIn("database connection", str(exc))

    def test_missing_mysql_driver_names_the_extra(self) -> None:
        with mock.patch.dict(sys.modules, {"pymysql": None}):
            exc = self.assertRaises(
                ConfigError, make_engine, "mysql://u:secret@127.0.0.1/db"
            )
        self.assertIn("pip install 'trusted-cloud[mysql]'", str(exc))
        self.assertNotIn("secret", str(exc))

    def test_missing_postgresql_driver_names_the_extra(self) -> None:
        with mock.patch.dict(sys.modules, {"psycopg": None}):
            exc = self.assertRaises(
                ConfigError, make_engine, "postgresql://u@127.0.0.1/db"
            )
        self.assertIn("pip install 'trusted-cloud[postgresql]'", str(exc))
