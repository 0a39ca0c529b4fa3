"""Debian's Chromium, headless, driven by Selenium through chromedriver.

``Browser()`` starts ``/usr/bin/chromium`` under ``/usr/bin/chromedriver``
(Debian's ``chromium`` and ``chromium-driver``; nothing is downloaded) in a
1280x800 window. :meth:`Browser.login` signs in through Horizon's login
form as a person would; every wait is an explicit condition with a
deadline (:meth:`Browser.wait_for`). :class:`BrowserCase` keeps one browser
per test class and, when a test fails, adds the page's address, source and
a screenshot to the test's details.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar
from urllib.parse import quote

import testtools
from selenium import webdriver
from selenium.common.exceptions import TimeoutException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait
from testtools.content import Content, text_content
from testtools.content_type import ContentType

from trusted_testing.procs import die_with_parent

__all__ = ["By", "Browser", "BrowserCase", "BrowserError"]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SETPRIV = "/usr/bin/setpriv"  # util-linux (Essential: yes)
WINDOW = (1280, 800)

T = TypeVar("T")


#: the text of a DataTable's cell by its column's header (Horizon renders
#: no column name on the cells)
_CELL = """
const [table, rowId, label] = arguments;
const heads = document.querySelectorAll(`#${table} thead tr:last-child th`);
const i = Array.from(heads).findIndex(th => th.textContent.trim() === label);
const row = document.getElementById(rowId);
if (i < 0 || !row || !row.children[i]) return null;
return row.children[i].textContent;
"""


_PAGE_HEIGHT = "return document.documentElement.scrollHeight"


class BrowserError(RuntimeError):
    """The browser could not be started, or a page was not as expected."""


class Browser:
    """One headless Chromium session against ``base_url``.

    Args:
        base_url: the site (``http://127.0.0.1:PORT``); paths are relative
            to it.
        timeout: the default deadline of every wait, in seconds.
    """

    def __init__(self, base_url: str, timeout: float = 30.0) -> None:
        for path in (CHROMIUM, CHROMEDRIVER):
            if not os.path.exists(path):
                raise BrowserError(
                    f"{path} is missing: install Debian's chromium and "
                    "chromium-driver (make deps)"
                )
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._tmp = tempfile.mkdtemp(prefix="trusted-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = self._launcher()
        for arg in (
            "--headless=new",
            "--no-sandbox",  # tests run as root
            "--disable-dev-shm-usage",
            "--disable-gpu",
            f"--window-size={WINDOW[0]},{WINDOW[1]}",
            f"--user-data-dir={os.path.join(self._tmp, 'profile')}",
            "--no-first-run",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-sync",
            "--disable-component-update",
            "--disable-default-apps",
            "--lang=en-US",
        ):
            options.add_argument(arg)
        # chromedriver (and the chromium under it) get SIGTERM if the test
        # process dies, however it dies
        service = Service(
            executable_path=CHROMEDRIVER,
            popen_kw={"preexec_fn": die_with_parent},
        )
        try:
            self.driver = webdriver.Chrome(options=options, service=service)
        except WebDriverException as exc:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise BrowserError(f"chromium did not start: {exc.msg}") from exc
        self.driver.set_page_load_timeout(timeout * 2)
        # headless Chromium counts its (invisible) window frame in
        # --window-size: make the page itself 1280x800, a laptop's screen
        self._viewport(*WINDOW)

    def _launcher(self) -> str:
        """A script that starts Debian's chromium with SIGTERM as its
        parent-death signal (``setpriv --pdeathsig``), so that it ends with
        chromedriver (which ends with this process) instead of outliving a
        killed test run."""
        path = os.path.join(self._tmp, "chromium.sh")
        with open(path, "w") as f:
            f.write(f'#!/bin/sh\nexec {SETPRIV} --pdeathsig TERM {CHROMIUM} "$@"\n')
        os.chmod(path, 0o755)
        return path

    # -- pages -----------------------------------------------------------------

    def get(self, path: str) -> None:
        """Open ``path`` and wait until the document is loaded."""
        self.driver.get(self.base_url + path)
        self.wait_loaded()

    def wait_loaded(self) -> None:
        self.wait_for(
            lambda d: d.execute_script("return document.readyState") == "complete",
            "the page to load",
        )

    @property
    def path(self) -> str:
        """The current address without the site."""
        url = str(self.driver.current_url)
        return url[len(self.base_url) :] if url.startswith(self.base_url) else url

    @property
    def source(self) -> str:
        return str(self.driver.page_source)

    def wait_for(
        self,
        condition: Callable[[Any], T],
        what: str,
        timeout: float | None = None,
    ) -> T:
        """Wait for ``condition(driver)`` to be truthy; its value.

        Raises:
            BrowserError: not within the deadline (naming ``what`` and the
                page's address).
        """
        wait = WebDriverWait(self.driver, timeout or self.timeout)
        try:
            return wait.until(condition)
        except TimeoutException:
            raise BrowserError(f"waited in vain for {what} on {self.path}") from None

    def find(self, css: str, timeout: float | None = None) -> WebElement:
        """The visible element ``css`` (waited for)."""
        found = self.wait_for(
            ec.visibility_of_element_located((By.CSS_SELECTOR, css)),
            css,
            timeout,
        )
        assert isinstance(found, WebElement)
        return found

    def find_all(self, css: str) -> list[WebElement]:
        """The elements ``css`` now (no wait)."""
        return list(self.driver.find_elements(By.CSS_SELECTOR, css))

    def present(self, css: str) -> bool:
        return bool(self.find_all(css))

    def text(self, css: str) -> str:
        return str(self.find(css).text)

    def cell(self, table: str, row_id: str, column: str) -> str:
        """The text of a Horizon DataTable's cell: table ``table`` (its
        ``Meta.name``), the row whose id is ``row_id``, the column headed
        ``column`` (waited for)."""
        found = self.wait_for(
            lambda d: d.execute_script(_CELL, table, row_id, column),
            f"cell {column!r} of row {row_id} of table {table}",
        )
        return str(found).strip()

    def click(self, css: str) -> None:
        found = self.wait_for(
            ec.element_to_be_clickable((By.CSS_SELECTOR, css)), f"{css} clickable"
        )
        assert isinstance(found, WebElement)
        found.click()

    def screenshot(self, path: str, full_page: bool = False) -> None:
        """A PNG of the window as it is (``full_page``: the page's whole
        height, 1280 wide)."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        width, height = WINDOW
        if full_page:
            height = max(
                height, int(self.driver.execute_script(_PAGE_HEIGHT) or height)
            )
            self._viewport(width, height)
        try:
            if not self.driver.save_screenshot(path):
                raise BrowserError(f"no screenshot written to {path}")
        finally:
            if full_page:
                self._viewport(*WINDOW)

    def _viewport(self, width: int, height: int) -> None:
        self.driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    def screenshot_png(self) -> bytes:
        return bytes(self.driver.get_screenshot_as_png())

    # -- Horizon ---------------------------------------------------------------

    def login(
        self,
        user: str,
        password: str,
        project: str | None = None,
        landing: str = "/settings/",
    ) -> None:
        """Sign in through Horizon's login form (``/auth/login/``), landing
        on ``landing`` (Horizon's own settings page by default: the
        project overview asks Nova, which the tests do not run), then make
        ``project`` the current project if it is not already.

        Raises:
            BrowserError: the login was refused or ``project`` is not one
                of the user's.
        """
        self.logout()
        self.get(f"/auth/login/?next={quote(landing)}")
        self.find("#id_username").send_keys(user)
        self.find("#id_password").send_keys(password)
        self.click("#loginBtn")
        self.wait_for(
            lambda d: (
                "/auth/login" not in d.current_url
                or d.find_elements(By.CSS_SELECTOR, ".alert-danger, .error")
            ),
            f"{user} to be signed in",
        )
        self.wait_loaded()
        if "/auth/login" in self.path:
            alert = self.find_all(".alert-danger, .error")
            said = alert[0].text.strip() if alert else "no message"
            raise BrowserError(f"login as {user} refused: {said}")
        if project is not None and self.current_project() != project:
            self.switch_project(project)

    def logout(self) -> None:
        """Sign out through the user menu's "Sign Out", if signed in."""
        if not self.driver.current_url.startswith(self.base_url):
            return
        self.get("/settings/")  # any page with the header; or the login form
        if "/auth/login" in self.path:
            return
        self.click(".user-menu .dropdown-toggle")
        self.click(".user-menu form[action$='/auth/logout/'] button")
        self.find("#id_username")

    def current_project(self) -> str:
        """The project named in Horizon's header."""
        return self.text(".context-project").strip()

    def switch_project(self, project: str) -> None:
        links = [
            a.get_attribute("href")
            for a in self.find_all("a[href*='/auth/switch/']")
            if (a.get_attribute("textContent") or "").strip() == project
        ]
        if not links:
            raise BrowserError(f"{project} is not among the user's projects")
        self.driver.get(str(links[0]))
        self.wait_loaded()
        self.wait_for(lambda d: self.current_project() == project, f"project {project}")

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)


class BrowserCase(testtools.TestCase):
    """A test class with one :class:`Browser` (:attr:`browser`), started by
    :meth:`start_browser` in ``setUpClass``; a failing test gets the page's
    address, source and screenshot in its details."""

    browser: ClassVar[Browser | None] = None

    @classmethod
    def start_browser(cls, base_url: str) -> Browser:
        cls.browser = Browser(base_url)
        return cls.browser

    @classmethod
    def stop_browser(cls) -> None:
        if cls.browser is not None:
            cls.browser.close()
            cls.browser = None

    @property
    def b(self) -> Browser:
        if self.browser is None:
            raise BrowserError("no browser started for this class")
        return self.browser

    def setUp(self) -> None:
        super().setUp()
        self.addOnException(self._page_details)

    def _page_details(self, exc_info: object) -> None:
        browser = self.browser
        if browser is None:
            return
        try:
            self.addDetail("page-url", text_content(str(browser.driver.current_url)))
            self.addDetail("page-source", text_content(browser.source))
            png = browser.screenshot_png()
        except WebDriverException as exc:
            self.addDetail("page-error", text_content(f"no page details: {exc.msg}"))
            return
        self.addDetail(
            "page-screenshot", Content(ContentType("image", "png"), lambda: [png])
        )
