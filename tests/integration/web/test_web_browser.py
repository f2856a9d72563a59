"""The console in a real browser: Debian's chromium, headless, driven by Playwright
(never a downloaded browser). Skipped only when chromium or playwright is absent."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rsched.api import Rsched
from tests.integration.web.conftest import start_web
from tests.support import Cli, wait_for

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOT = Path(__file__).resolve().parents[3] / "docs" / "web-overview.png"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no {CHROMIUM} (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def test_pause_a_cron_from_the_overview(browser: Any, cli: Cli, rs: Rsched) -> None:
    runner = cli.spawn(
        "run",
        "cron",
        "nightly.report",
        "--schedule",
        "0 2 * * *",
        "--tz",
        "Europe/Berlin",
        "--",
        "true",
    )
    wait_for(lambda: cli.json("crons") != [], timeout=15, what="the cron to register")
    rs.add("mail.send", "order-1001", delay="30m", payload={"to": "ops@example.com"})
    rs.add("report.build", "2026-12-01")
    w = start_web(cli)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(w.base + "/")
    row = page.locator("#cron-nightly\\.report")
    assert "active" in row.inner_text()
    if os.environ.get("WEB_SCREENSHOT"):  # docs/web-overview.png, on demand
        page.screenshot(path=str(SCREENSHOT), full_page=True)
    row.locator("button[name=pause]").click()
    page.wait_for_url(w.base + "/")
    assert "paused" in page.locator("#cron-nightly\\.report .state").inner_text()
    assert cli.json("crons")[0]["paused"] is True
    # the live refresh: a change made elsewhere shows up without reloading the page
    cli("resume", "nightly.report", check=0)
    # (the overview's snapshot is shared for 2 s: refresh until the change shows)
    state = page.locator("#cron-nightly\\.report .state")

    def refreshed() -> bool:
        page.evaluate("document.dispatchEvent(new Event('rsched:refresh'))")
        page.wait_for_timeout(300)
        return "active" in state.inner_text()

    wait_for(refreshed, timeout=15, what="the live refresh to show the resumed cron")
    assert errors == []  # no CSP violation, no script error
    runner.terminate()
    page.close()


def test_a_hostile_task_runs_no_script(browser: Any, cli: Cli, rs: Rsched) -> None:
    evil = "<script>window.__pwned=1;alert('id')</script><img/src=x/onerror=window.__pwned=2>"
    rs.add("x", evil, payload={"html": evil, "text": "</pre><script>window.__pwned=3</script>"})
    w = start_web(cli)
    page = browser.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(w.base + "/queues/default")
    link = page.locator("#tasks a").first
    assert link.inner_text() == evil  # shown as text
    link.click()
    page.wait_for_selector("#payload")
    assert page.locator("#task-id").inner_text() == evil
    assert "window.__pwned=3" in page.locator("#payload").inner_text()
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert dialogs == []
    page.close()
