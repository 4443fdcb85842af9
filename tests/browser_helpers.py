"""A headless Chromium driven by Selenium, for the dashboard's tests.

Debian's ``chromium`` and ``chromium-driver`` only: the driver path is passed, so
Selenium Manager never downloads anything. Outside CI a missing browser skips the
tests with one line; inside CI (``CI=true``) it fails them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.conftest import ROOT, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOTS = ROOT / "docs" / "screenshots"


def require_browser() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if not missing:
        return
    why = f"no browser for the dashboard tests ({', '.join(missing)} missing): apt-get install chromium chromium-driver"
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


class Browser:
    def __init__(self) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self.profile = tempfile.mkdtemp(prefix="dash-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1280,900", f"--user-data-dir={self.profile}"):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, for console_errors()
        self.driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
        self.driver.implicitly_wait(0)

    def open(self, url: str) -> None:
        self.driver.get(url)
        wait_for(lambda: self.driver.execute_script("return document.readyState") == "complete", 10,
                 message=f"{url} loaded")

    def css(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return list(self.driver.find_elements(By.CSS_SELECTOR, selector))

    def text(self, selector: str) -> str:
        """The visible text of the first match, read in one script call (the live refresh
        may replace the page's elements between two WebDriver calls)."""
        t = self.driver.execute_script("const e = document.querySelector(arguments[0]);"
                                       "return e ? e.innerText.trim() : '';", selector)
        return str(t)

    def texts(self, selector: str) -> list[str]:
        return [str(t) for t in self.driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.innerText.trim());", selector)]

    def click(self, selector: str) -> None:
        """Click the first match, finding it again if a refresh replaced it meanwhile."""
        from selenium.common.exceptions import StaleElementReferenceException

        def attempt() -> bool:
            try:
                self.css(selector)[0].click()
            except StaleElementReferenceException:
                return False
            return True
        wait_for(attempt, 10, interval=0.05, message=f"click {selector}")

    def type(self, selector: str, text: str, *, clear: bool = False) -> None:
        """Type into the first match, finding it again if a live refresh replaced it
        meanwhile (a replaced element is detached: ChromeDriver calls it stale, or not
        interactable). Once focused, an input holds off the refresh (the page's typing())."""
        from selenium.common.exceptions import ElementNotInteractableException, StaleElementReferenceException

        def attempt() -> bool:
            try:
                box = self.css(selector)[0]
                if clear:
                    box.clear()
                box.send_keys(text)
            except (StaleElementReferenceException, ElementNotInteractableException, IndexError):
                return False
            return True
        wait_for(attempt, 10, interval=0.05, message=f"type into {selector}")

    def wait_text(self, selector: str, check: Callable[[str], bool], timeout: float = 20, what: str = "") -> str:
        def ok() -> str | None:
            t = self.text(selector)
            return t if check(t) else None
        return str(wait_for(ok, timeout, interval=0.1,
                            message=f"{what or selector}: now {self.text(selector)!r}"))

    def console_errors(self) -> list[str]:
        """The console's errors since the last call (each call drains the log)."""
        return [str(e["message"]) for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]

    def screenshot(self, name: str) -> None:
        """Kept under docs/screenshots/ when UPDATE_SCREENSHOTS=1 (the README shows them)."""
        if os.environ.get("UPDATE_SCREENSHOTS") == "1":
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            self.driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))
        else:
            assert self.driver.get_screenshot_as_png().startswith(b"\x89PNG")

    def quit(self) -> None:
        self.driver.quit()
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    require_browser()
    b = Browser()
    yield b
    b.quit()


__all__ = ["Browser", "browser", "require_browser"]
