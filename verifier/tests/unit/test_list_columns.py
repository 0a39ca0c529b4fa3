"""A list of nodes reads only the columns of their views (issue 34, item
7): the soak lists 10,000 nodes every two seconds, and each call read every
node's certificate, AK and V share only to drop them."""

from __future__ import annotations

import json
import os
import tempfile
import time

import sqlalchemy as sa
import testtools
from sqlalchemy.orm.exc import DetachedInstanceError

from trusted_testing.bench_nodes import attested_row, ecc_ak
from verifier import db
from verifier.attest.node import VIEW_COLUMNS, view_of_row
from verifier.attest.store import NodeStore

_HEAVY = ("tls_cert", "v_share", "ak_public", "identity_cert", "ima_pcr")


class ListColumnsTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        path = os.path.join(tempfile.mkdtemp(), "v.sqlite")
        self.engine = db.make_engine(f"sqlite:///{path}")
        self.addCleanup(self.engine.dispose)
        db.upgrade(self.engine)
        policy = json.dumps({"hash": "sha256", "pcrs": {"16": ["00" * 32]}})
        rows = [
            attested_row(i, policy, ecc_ak(), time.time(), runtime_policy_follow=name)
            for i, name in enumerate((None, "base", None))
        ]
        with self.engine.begin() as conn:
            conn.execute(db.Node.__table__.insert(), rows)
        self.store = NodeStore(self.engine, time.time, None)

    def test_a_list_leaves_certificates_keys_and_shares_unread(self) -> None:
        rows = self.store.load_all(None, VIEW_COLUMNS)
        self.assertEqual(3, len(rows))
        for row in rows:
            unloaded = sa.inspect(row).unloaded
            for name in _HEAVY:
                self.assertIn(name, unloaded)
            self.assertRaises(DetachedInstanceError, getattr, row, "tls_cert")

    def test_the_views_are_those_of_whole_rows(self) -> None:
        whole = [view_of_row(row) for row in self.store.load_all()]
        narrow = [view_of_row(row) for row in self.store.load_all(None, VIEW_COLUMNS)]
        self.assertEqual(whole, narrow)
        self.assertEqual(("base", None), narrow[1].follows)
