"""The attestation dashboard as people use it: Debian's Chromium, driven by
Selenium, against a real Horizon 27 with the plugin, a real Keystone, the
verifier (``auth_strategy = keystone``, in the catalog as ``attestation``)
and agents on swtpm (:mod:`trusted_testing.dashboard_story`).

Projects ``alpha`` (``alice`` member, ``rita`` reader) and ``beta`` (``bob``
member) of the shared Keystone (:mod:`.tenancy_base`) own the nodes
``web``, ``db`` and ``cache`` (alpha) and ``batch`` (beta). The tests are
one story, in order: a failing one adds the page's address, source and a
screenshot to its details.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import ClassVar

from selenium.webdriver.support.ui import Select
from testtools.content import text_content

from trusted_testing.browser import BrowserCase
from trusted_testing.dashboard_story import DashboardDeployment, StoryNode
from trusted_testing.keystone import ADMIN_PASSWORD
from verifier.tests.functional.tenancy_base import shared_keystone

NODES = "/project/attestation_nodes/"
FLEET = "/admin/attestation/"
UNREACHABLE = "The attestation service cannot be reached:"


class TestDashboardInTheBrowser(BrowserCase):
    deployment: ClassVar[DashboardDeployment]
    _work: ClassVar[str]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        shared = shared_keystone()
        cls._work = tempfile.mkdtemp(prefix="trusted-dashboard-")
        cls.deployment = DashboardDeployment(
            cls._work,
            shared["keystone"],
            shared["nova"],
            shared["users"],
            shared["tokens"],
        )
        try:
            cls.deployment.start()
            cls.start_browser(cls.deployment.horizon.url)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            cls.stop_browser()
            cls.deployment.stop()
        finally:
            shutil.rmtree(cls._work, ignore_errors=True)
            super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        self.addDetail("deployment", text_content(self.deployment.describe()))

    # -- helpers ---------------------------------------------------------------

    def node(self, name: str) -> StoryNode:
        return self.deployment.nodes[name]

    def login(self, who: str) -> None:
        if who == "admin":  # Keystone's bootstrap administrator
            self.b.login("admin", ADMIN_PASSWORD, "admin")
            return
        user = self.deployment.users[who]
        self.b.login(user.name, user.password, user.project_name)

    def row(self, table: str, node: StoryNode) -> str:
        """The CSS selector of ``node``'s row in DataTable ``table``."""
        return f"#{table}__row__{node.uuid}"

    def state_cell(self, table: str, node: StoryNode) -> str:
        return self.b.cell(table, f"{table}__row__{node.uuid}", "State")

    def confirm(self, action: str) -> None:
        """Horizon's confirm dialog of ``action``: read, confirm, wait for
        the page it submits to."""
        title = self.b.text("#modal_wrapper .modal .modal-title")
        self.assertIn(action, title)
        self.b.click("#modal_wrapper .modal-footer .btn-danger")
        self.b.wait_for(
            lambda d: not d.find_elements("css selector", "#modal_wrapper .modal"),
            "the confirmed action's page",
        )
        self.b.wait_loaded()

    # -- the story ---------------------------------------------------------------

    def test_1_member_sees_only_its_projects_nodes_and_their_states(self) -> None:
        self.login("alice")
        self.b.get(NODES)
        for name in ("web", "db", "cache"):
            self.assertEqual("attested", self.state_cell("nodes", self.node(name)))
        batch = self.node("batch")
        self.assertFalse(self.b.present(self.row("nodes", batch)))
        self.assertNotIn(batch.uuid, self.b.source)
        self.assertEqual(3, len(self.b.find_all("#nodes tbody tr[id^='nodes__row__']")))

    def test_2_tampered_node_shows_revoked_and_its_page_names_the_reason(
        self,
    ) -> None:
        cache = self.node("cache")
        self.deployment.tamper(cache)
        self.deployment.wait_state(cache, "revoked")
        self.login("alice")
        self.b.get(NODES)
        self.assertEqual("revoked", self.state_cell("nodes", cache))
        self.assertEqual("attested", self.state_cell("nodes", self.node("web")))
        self.b.click(f"{self.row('nodes', cache)} a[href$='/{cache.uuid}/']")
        self.b.wait_for(
            lambda d: cache.uuid in d.current_url, "the node's page", timeout=30
        )
        self.assertEqual("revoked", self.b.text("#node-state"))
        reason = self.b.text("#node-failure-reason")
        self.assertIn("pcr_policy", reason)
        self.assertIn("PCR 16", reason)

    def test_3_member_changes_a_nodes_policy_through_the_modal(self) -> None:
        db = self.node("db")
        before = self.deployment.node("alice", db)["policies"]["measured-boot"]
        self.assertIsNone(before)
        self.login("alice")
        self.b.get(NODES)
        row = self.row("nodes", db)
        # Horizon shows a row's first action as a button, the rest in a menu
        self.b.click(f"{row} a#nodes__row_{db.uuid}__action_change_policy")
        select = Select(self.b.find(".modal-dialog select#id_mb_policy"))
        select.select_by_value("golden@1")
        self.b.click(".modal-dialog .modal-footer [type='submit']")
        self.b.wait_for(
            lambda d: not d.find_elements("css selector", ".modal-dialog"),
            "the modal to close",
        )
        after = self.deployment.node("alice", db)["policies"]["measured-boot"]
        self.assertIn("golden", str(after))
        self.b.get(NODES)  # the table says it too
        self.assertIn(
            "golden", self.b.cell("nodes", f"nodes__row__{db.uuid}", "Policy in force")
        )

    def test_4_reader_sees_the_nodes_without_actions_and_the_api_refuses_it(
        self,
    ) -> None:
        web = self.node("web")
        self.login("rita")
        self.b.get(NODES)
        self.assertEqual("attested", self.state_cell("nodes", web))
        for action in ("change_policy", "revoke", "delete"):
            self.assertEqual([], self.b.find_all(f"[id$='__action_{action}']"), action)
        resp = self.deployment.api(
            "rita", "POST", f"/v1/nodes/{web.uuid}/revoke", {"detail": "reader"}
        )
        self.assertEqual(403, resp.status_code, resp.text)
        self.assertEqual("attested", self.deployment.node("alice", web)["state"])

    def test_5_admin_sees_the_fleet_across_projects_with_the_state_chart(
        self,
    ) -> None:
        self.login("admin")
        self.b.get(FLEET)
        for node in self.deployment.nodes.values():
            self.assertTrue(self.b.present(self.row("fleet", node)), node.name)
        self.assertEqual("revoked", self.state_cell("fleet", self.node("cache")))
        self.b.find("svg#state-chart")
        self.b.find("#verifier-stats")
        revocations = self.b.text("#revocations")
        self.assertIn(self.node("cache").uuid, revocations)
        self.assertIn("pcr_policy", revocations)

    def test_6_another_projects_node_in_the_url_is_horizons_not_found_page(
        self,
    ) -> None:
        self.login("alice")
        self.b.get(f"{NODES}{self.node('batch').uuid}/")
        self.assertIn(
            "the page you were looking for does not exist",
            self.b.text("#page_heading"),
        )
        self.assertNotIn("Traceback", self.b.source)

    def test_7_api_stopped_the_page_says_so_in_one_line_and_horizon_works(
        self,
    ) -> None:
        self.login("alice")
        self.deployment.stop_verifier()
        self.addCleanup(self.deployment.start_verifier)
        self.b.get(NODES)
        alerts = [
            a.text for a in self.b.find_all(".alert-danger") if UNREACHABLE in a.text
        ]
        self.assertEqual(1, len(alerts), alerts)
        self.assertEqual(1, len(alerts[0].strip().splitlines()), alerts)
        self.assertEqual([], self.b.find_all("#nodes tbody tr[id^='nodes__row__']"))
        self.b.get("/settings/")  # Horizon's own pages still work
        self.assertIn("Settings", self.b.text(".page-header"))
        self.assertNotIn(UNREACHABLE, self.b.source)

    def test_8_member_revokes_and_deletes_behind_horizons_confirm_dialog(
        self,
    ) -> None:
        web, cache = self.node("web"), self.node("cache")
        self.deployment.wait_state(web, "attested")  # the API is back (test 7)
        self.login("alice")
        self.b.get(NODES)
        row = f"#nodes__row__{web.uuid}"
        self.b.click(f"{row} .dropdown-toggle")  # the row's other actions
        self.b.click(f"#nodes__row_{web.uuid}__action_revoke")
        self.confirm("Revoke Node")
        self.assertEqual("revoked", self.state_cell("nodes", web))
        node = self.deployment.node("alice", web)
        self.assertEqual("revoked", node["state"])
        self.assertIn("tenant_revoked", node["failure_reason"])
        # a revoked node's first action is Delete
        self.b.click(f"#nodes__row_{cache.uuid}__action_delete")
        self.confirm("Delete Node")
        self.b.wait_for(
            lambda d: not d.find_elements("id", f"nodes__row__{cache.uuid}"),
            "the deleted node's row to go",
        )
        resp = self.deployment.api("alice", "GET", f"/v1/nodes/{cache.uuid}")
        self.assertEqual(404, resp.status_code, resp.text)
