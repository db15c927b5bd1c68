"""Headless Chromium for the page's tests: the system's browser (Debian's `chromium`, which
.ci/run installs) driven by Playwright, never a browser Playwright downloads.

`browser` is a session fixture; without Playwright or a Chromium it skips, saying which is
missing and how to get it. `shot(page, name)` keeps a screenshot as a test artefact in
build/page-shots/ (git-ignored; TK_PAGE_SHOTS names another folder).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHOTS = Path(os.environ.get("TK_PAGE_SHOTS") or REPO / "build" / "page-shots")


def chromium_path() -> str | None:
    """The system Chromium: $TK_CHROMIUM, else chromium or chromium-browser on PATH."""
    named = os.environ.get("TK_CHROMIUM")
    if named:
        return named if os.access(named, os.X_OK) else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="session")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("no Playwright: pip install -e '.[test]' to run the page's browser tests")
    path = chromium_path()
    if path is None:
        pytest.skip("no Chromium: apt-get install chromium (or set TK_CHROMIUM) to run the page's browser tests")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=path)
        yield chromium
        chromium.close()


def watched(page, requests: bool = True):
    """`page`, recording its console errors in `page.tk_errors` and (with `requests`) every URL it
    asks for in `page.tk_requests`."""
    page.tk_errors, page.tk_requests = [], []
    page.on("console", lambda m: m.type == "error" and page.tk_errors.append(m.text))
    page.on("pageerror", lambda e: page.tk_errors.append(str(e)))
    if requests:
        page.on("request", lambda r: page.tk_requests.append(r.url))
    return page


def open_page(browser, url: str, **options):
    """A new, `watched` page at `url`, waited until it has drawn (body[data-ready="1"])."""
    return open_in(browser, url, viewport={"width": 1280, "height": 900}, **options)


def open_in(owner, url: str, **options):
    """A new, `watched` page of `owner` (a browser, or a context a test made) at `url`, drawn."""
    page = watched(owner.new_page(**options))
    page.goto(url)
    wait_drawn(page)
    return page


def wait_drawn(page, timeout_ms: int = 30_000) -> None:
    page.wait_for_selector('body[data-ready="1"]', timeout=timeout_ms)


def shot(page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
