#!/usr/bin/env python3
"""Screenshots of the attestation dashboard for the user and admin guides.

Runs the browser tests' deployment (a real Keystone, the verifier and four
agents on swtpm, Horizon with the plugin:
:mod:`trusted_testing.dashboard_story`), plays the same story (a node
tampered with, a policy with two versions) and saves a 1280x800 PNG of each
page into ``doc/source/images/dashboard-<page>.png``::

    .venv/bin/python tools/dashboard-screenshots.py [--out DIR]

Takes about two minutes (Horizon's static files are built once before, into
``~/.cache/trusted-cloud/horizon-static``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from selenium.webdriver.support.ui import Select  # noqa: E402

from trusted_testing.browser import Browser, BrowserError  # noqa: E402
from trusted_testing.dashboard_story import DashboardDeployment  # noqa: E402
from trusted_testing.keystone import ADMIN_PASSWORD  # noqa: E402
from verifier.tests.functional.tenancy_base import shared_keystone  # noqa: E402

NODES = "/project/attestation_nodes/"
POLICIES = "/project/attestation_policies/"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "doc", "source",
                   "images")  # fmt: skip


def _story(dep: DashboardDeployment) -> None:
    """What the pages show: a second version of the policy, one node
    revoked for tampering."""
    dep.upload_policy("alice", "measured-boot", "golden", {"secure_boot": False})
    cache = dep.nodes["cache"]
    dep.tamper(cache)
    dep.wait_state(cache, "revoked")


def _shoot(b: Browser, out: str, page: str, full_page: bool = False) -> None:
    path = os.path.join(out, f"dashboard-{page}.png")
    b.screenshot(path, full_page)
    print(f"wrote {os.path.relpath(path)}")


def _pages(dep: DashboardDeployment, b: Browser, out: str) -> None:
    alice = dep.users["alice"]
    cache = dep.nodes["cache"]
    b.login(alice.name, alice.password, alice.project_name)
    b.get(NODES)
    b.find("#nodes")
    _shoot(b, out, "nodes")
    b.get(f"{NODES}{cache.uuid}/")
    b.find("#node-failure-reason")
    _shoot(b, out, "node")
    b.get(f"{NODES}{cache.uuid}/?tab=node_details__events")
    b.find("#events")
    _shoot(b, out, "node-events")
    b.get(f"{NODES}{cache.uuid}/?tab=node_details__history")
    b.find("#quote-timeline")
    _shoot(b, out, "node-history")
    b.get(NODES)
    b.click(f"#nodes__row_{dep.nodes['db'].uuid}__action_change_policy")
    Select(b.find(".modal-dialog select#id_mb_policy")).select_by_value("golden")
    _shoot(b, out, "change-policy")
    b.get(POLICIES)
    b.find("#policies")
    _shoot(b, out, "policies")
    b.get(f"{POLICIES}measured-boot/golden/")
    b.wait_loaded()
    _shoot(b, out, "policy")
    b.get(POLICIES)
    b.click("#policies__action_upload")
    b.find(".modal-dialog form")
    _shoot(b, out, "upload")
    b.login("admin", ADMIN_PASSWORD, "admin")
    b.get("/admin/attestation/")
    b.find("svg#state-chart")
    _shoot(b, out, "admin", full_page=True)
    dep.stop_verifier()
    try:
        b.login(alice.name, alice.password, alice.project_name)
        b.get(NODES)
        b.find(".alert-danger")
        _shoot(b, out, "unreachable")
    finally:
        dep.start_verifier()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT, help="where the PNGs go")
    args = parser.parse_args(argv)
    shared = shared_keystone()
    work = tempfile.mkdtemp(prefix="trusted-dashboard-shots-")
    dep = DashboardDeployment(
        work, shared["keystone"], shared["nova"], shared["users"], shared["tokens"]
    )
    browser = None
    try:
        dep.start()
        _story(dep)
        browser = Browser(dep.horizon.url)
        _pages(dep, browser, os.path.abspath(args.out))
    except (BrowserError, RuntimeError) as exc:
        print(f"dashboard-screenshots: {exc}", file=sys.stderr)
        return 1
    finally:
        if browser is not None:
            browser.close()
        dep.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
