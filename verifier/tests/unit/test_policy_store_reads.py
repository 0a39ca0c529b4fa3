"""What the policy store reads from the database (issue 19, IMA under
load): every enrolment resolves its runtime policy reference, and reading
the stored body there (12 MB of JSON for a 100,000-path allowlist) made
enrolling N nodes cost N times the policy's size (SQLite walks an inline
body to reach the columns after it: 22 ms of CPU per enrolment with
100,000 paths). Resolving reads the key only; showing a policy still
reads its body. Real SQLite database, migrated as the verifier does."""

from __future__ import annotations

from typing import Any

import fixtures
import sqlalchemy as sa
import testtools

from verifier.attest.policies import PolicyStore
from verifier.db import make_engine, upgrade


class PolicyStoreReadsTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        workdir = self.useFixture(fixtures.TempDir()).path
        self.engine = make_engine(f"sqlite:///{workdir}/verifier.db")
        self.addCleanup(self.engine.dispose)
        upgrade(self.engine)
        self.store = PolicyStore(self.engine)
        self.digests = {f"/usr/lib/f{i}": [f"sha256:{i:064x}"] for i in range(50)}
        document = {"name": "big", "version": 1, "digests": self.digests}
        self.meta, _ = self.store.add("runtime", document, project="p1")
        self.statements: list[str] = []
        sa.event.listen(self.engine, "before_cursor_execute", self._seen)
        self.addCleanup(
            sa.event.remove, self.engine, "before_cursor_execute", self._seen
        )

    def _seen(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.statements.append(statement)

    def selects(self) -> list[str]:
        return [s for s in self.statements if s.lstrip().upper().startswith("SELECT")]

    def test_resolving_a_reference_never_reads_the_body(self) -> None:
        for ref in ("big", "big@1", self.meta["digest"]):
            self.assertEqual(
                self.meta["digest"], self.store.resolve("runtime", ref, "p1")
            )
        self.assertEqual(3, len(self.selects()))
        for statement in self.selects():
            self.assertNotIn("body", statement)

    def test_showing_a_policy_still_reads_its_body(self) -> None:
        shown = PolicyStore(self.engine).get("runtime", "big", "p1")
        self.assertEqual(self.digests, shown["policy"]["digests"])
        self.assertTrue(any("body" in s for s in self.selects()))
