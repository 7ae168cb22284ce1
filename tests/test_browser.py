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
    from specdemo.app.models import MODELS

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


def test_the_status_trackers_frame_loop_is_calmed(page):
    """The early script is in place before Gradio's modules and catches the status tracker's frame requests (an idle
    Gradio page otherwise asks for 60 frames a second on the cores the race runs on)."""
    first = page.evaluate("window.sdCalmedFrames")
    page.wait_for_timeout(1000)
    assert first > 0 and page.evaluate("window.sdCalmedFrames") > first


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
    assert re.search(r"step \d+ · accepted \d+ of \d+ drafted · source: prompt", spans.first.get_attribute("title"))
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
    svg = page.locator(".sd-tree svg.sd-tree-svg")
    assert svg.count() == 1 and svg.locator('[data-node="root"]').count() == 1  # the drawn tree
    assert svg.locator(".sd-t-acc, .sd-t-own").count() >= 1
    assert svg.bounding_box()["width"] > 50  # drawn, not just in the DOM


def test_colour_by_source(page):
    page.get_by_role("tab", name="Live plots").click()
    span = page.locator('#sd-spec .sd-text .sd-acc[data-src="prompt"]').first
    by_step = span.evaluate("e => getComputedStyle(e).backgroundColor")
    page.locator("#sd-colour label", has_text="by source").click()
    page.wait_for_function("document.body.classList.contains('sd-by-source')")
    assert span.evaluate("e => getComputedStyle(e).backgroundColor") != by_step
    assert page.locator("#sd-spec .sd-legend-source").is_visible()
    assert not page.locator("#sd-spec .sd-legend-step").is_visible()
    page.locator("#sd-colour label", has_text="by step").click()
    page.wait_for_function("!document.body.classList.contains('sd-by-source')")


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


def plot_marks(page) -> list[int]:
    """Per live plot on the page: how many data marks (lines, bars) its chart has drawn."""
    return page.locator(".sd-plot").evaluate_all(
        "els => els.map(e => e.querySelectorAll('.mark-line.role-mark path, .mark-rect.role-mark path').length)")


def test_the_plots_draw_while_racing(page, tmp_path):
    """While a race all runs, every live plot shows the race so far, and its title fits its box."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.get_by_role("tab", name="Live plots").click()
    page.locator("#sd-prompt textarea").fill("Explain how a hash table works, in simple terms.")
    tokens = page.get_by_label("number input for Max new tokens")
    if not tokens.is_visible():
        page.locator("#sd-settings .label-wrap").first.click()
    tokens.fill("128")
    tokens.press("Enter")
    page.locator("#sd-race-all").click()
    page.wait_for_selector('#sd-summary [data-status="running"]', timeout=300_000)
    # the plots redraw every few seconds of racing, each redraw re-embedding every chart (empty for a moment while
    # it renders): so the marks are counted at an instant when every chart has drawn, the curves one line per lane,
    # which comes within 30 s (a race of 128 tokens in every lane takes longer on two cores)
    try:
        marks = page.wait_for_function(
            """() => { const m = [...document.querySelectorAll('.sd-plot')].map(e => e.querySelectorAll(
                   '.mark-line.role-mark path, .mark-rect.role-mark path').length);
               const lanes = document.querySelectorAll('#sd-lanes .sd-lane').length;
               return m.length === 4 && m.every(x => x > 0) && m[0] === lanes && m; }""",
            timeout=30_000).json_value()
    except PlaywrightTimeout:
        marks = plot_marks(page)  # the assertions below say what is missing
    lanes = page.locator("#sd-lanes .sd-lane").count()
    page.screenshot(path=str(tmp_path / "mid-race.png"), full_page=True)
    print("mid-race screenshot:", tmp_path / "mid-race.png")
    assert len(marks) == 4 and all(m > 0 for m in marks), f"charts without marks mid-race: {marks}"
    legend = page.locator(".sd-plot").first.evaluate(
        "e => [...e.querySelectorAll('.role-legend-label text')].map(t => t.textContent)")
    assert len(legend) == lanes and marks[0] == lanes, (legend, marks)  # every lane's line, AR's included
    running = page.locator('#sd-summary [data-status="running"]').count()
    page.locator("#sd-stop").click()
    page.wait_for_selector('#sd-summary [data-status="stopped"], #sd-summary [data-status="done"]', timeout=120_000)
    assert running == 1, "the screenshot was taken after the race had ended"
    titles = page.locator(".sd-plot").evaluate_all(
        "els => els.map(e => [...e.querySelectorAll('.role-title-text, .role-legend-label text')]"
        ".every(t => t.getBoundingClientRect().right <= e.getBoundingClientRect().right + 1))")
    assert all(titles), f"a title or legend runs out of its chart: {titles}"


def test_race_all_in_the_browser(page):
    modes = page.locator("#sd-mode input").evaluate_all("els => els.map(e => e.value)")
    off = page.locator(".sd-mode-off").count()  # the modes that cannot run on this model, listed under the radio
    page.locator("#sd-prompt textarea").fill(PROMPT)
    tokens = page.get_by_label("number input for Max new tokens")
    if not tokens.is_visible():
        page.locator("#sd-settings .label-wrap").first.click()
    tokens.fill("32")  # five lanes on a loaded 2-core CI machine
    tokens.press("Enter")
    page.locator("#sd-race-all").click()
    page.wait_for_selector('#sd-summary [data-status="done"][data-lanes]', timeout=900_000)
    lanes = page.locator("#sd-lanes .sd-lane")
    assert lanes.count() == 1 + len(modes) - off  # AR and one lane per available mode
    assert page.locator('#sd-summary [data-identical="1"]').count() == 1
    texts = {lanes.nth(i).locator(".sd-text").inner_text() for i in range(lanes.count())}
    assert len(texts) == 1  # every lane wrote the same answer
    assert page.locator("#sd-lanes table.sd-board tbody tr").count() == lanes.count()
    assert not page.locator("#sd-ar").is_visible()  # the two-pane view gives way to the lanes
    assert int(page.locator('#sd-summary [data-status="done"]').get_attribute("data-drawn")) > 0
    page.wait_for_timeout(1500)  # let the plots draw
    page.screenshot(path=str(SCREENSHOT.with_name("screenshot-race-all.png")), full_page=True)
    page.get_by_role("tab", name="Step by step").click()
    assert page.locator("#sd-step-lane").is_visible()
    assert page.locator(".sd-tree svg.sd-tree-svg").count() == 1
    if "rest" in {lanes.nth(i).get_attribute("data-lane") for i in range(lanes.count())}:
        page.locator("#sd-step-lane input").click()
        page.get_by_role("option", name="REST").click()
        page.wait_for_selector("#sd-explain :text('The REST drafter')", timeout=60_000)
        page.wait_for_timeout(500)
        page.locator("#sd-steps").screenshot(path=str(SCREENSHOT.with_name("screenshot-tree.png")))
