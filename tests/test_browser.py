"""The page in a real browser: Debian's chromium driven by Python Playwright (no `playwright install`).

Types a prompt, picks prompt lookup, sets max new tokens, presses Generate, waits for the end, checks the highlighted
spans and the speedup readout, walks one step in the step-by-step tab and saves assets/screenshot.png (the README's).
Needs `apt-get install -y chromium`; skipped when it is missing.
"""
from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = Path(__file__).resolve().parent.parent / "assets" / "screenshot.png"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
PROMPT = ("Summarise this paragraph in two sentences:\nThe Eiffel Tower is a wrought-iron lattice tower on the Champ "
          "de Mars in Paris, France. It is named after the engineer Gustave Eiffel, whose company designed and built "
          "the tower from 1887 to 1889. Although initially criticised by some of France's leading artists for its "
          "design, it has since become a global cultural icon of France.")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium: apt-get install -y chromium"),
]


@pytest.fixture(scope="module")
def url(embedded):
    from specdemo.app.page import build_demo, launch_kwargs
    from specdemo.app.session import MODELS

    MODELS.put("embedded", embedded)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo = build_demo()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True,
                            **launch_kwargs())
    yield url
    demo.close()


@pytest.fixture(scope="module")
def page(url):
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.wait_for_selector(".sd-chip:not(.sd-chip-bad)", timeout=180_000)  # the model is loaded, header filled
        yield page
        browser.close()


def test_race_in_the_browser(page):
    page.locator("#sd-prompt textarea").fill(PROMPT)
    page.locator("#sd-mode label", has_text="Prompt lookup").click()
    page.locator("#sd-settings .label-wrap").first.click()
    tokens = page.get_by_label("number input for Max new tokens")
    tokens.fill("40")
    tokens.press("Enter")
    page.locator("#sd-settings .label-wrap").first.click()  # fold the settings away again

    page.locator("#sd-generate").click()
    page.wait_for_selector("#sd-spec .sd-state", timeout=180_000)  # streaming has begun
    page.wait_for_selector('#sd-summary [data-status="done"]', timeout=600_000)  # generous: a loaded 2-core CI machine is slow

    spans = page.locator("#sd-spec .sd-text .sd-acc")
    assert spans.count() > 0, "accepted draft tokens are highlighted"
    assert re.search(r"step \d+ · accepted \d+ of \d+ drafted · source: context", spans.first.get_attribute("title"))
    assert page.locator("#sd-spec .sd-text .sd-own").count() > 0  # the target's own tokens stay plain
    speedup = page.locator("#sd-summary .sd-card-value").first.inner_text()
    assert re.fullmatch(r"\d+\.\d\d×", speedup.strip()), speedup
    assert "identical" in page.locator("#sd-summary").inner_text()
    assert "40 tokens" in page.locator("#sd-ar .sd-stats").inner_text().replace("\n", " ") or \
        page.locator("#sd-ar .sd-state").inner_text() == "done"
    assert page.locator("#sd-ar .sd-text").inner_text() == page.locator("#sd-spec .sd-text").inner_text()
    # the page acknowledged the updates it drew, so the race paused for them (a browser on the server's machine)
    assert int(page.locator('#sd-summary [data-status="done"]').get_attribute("data-drawn")) > 0

    page.wait_for_timeout(1500)  # let the plots draw
    page.screenshot(path=str(SCREENSHOT), full_page=True)


def test_step_by_step_in_the_browser(page):
    page.get_by_role("tab", name="Step by step").click()
    page.locator("#sd-next").click()
    page.wait_for_selector("#sd-explain :text('Step 2 of')", timeout=60_000)
    assert page.locator(".sd-tree > ul .sd-n-root").count() == 1
    assert page.locator(".sd-tree .sd-n-acc, .sd-tree .sd-n-own").count() >= 1


def test_stop_ends_the_race_within_a_step(page):
    page.get_by_role("button", name="Writing").click()  # an example with a long answer
    page.locator("#sd-settings .label-wrap").first.click()
    tokens = page.get_by_label("number input for Max new tokens")
    tokens.fill("300")  # far more than can finish between the first step and the click
    tokens.press("Enter")
    page.locator("#sd-generate").click()
    page.wait_for_selector('#sd-summary [data-status="running"]', timeout=180_000)
    page.locator("#sd-stop").click()
    page.wait_for_selector('#sd-summary [data-status="stopped"]', timeout=60_000)
    assert "Stopped" in page.locator("#sd-message").inner_text()
