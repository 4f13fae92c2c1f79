"""Drive the dashboard in headless Chromium: run each tab, wait for its results, save screenshots.

Used by tests/test_browser.py and to make the screenshots in docs/:
    cd tests && python -m screenshots http://127.0.0.1:7860 ../docs/screenshots [live,compare,theory]
"""
from __future__ import annotations

import sys
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"  # Debian's chromium (apt-get install -y chromium)
HEADLESS_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1400, "height": 1000}


def open_browser(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=HEADLESS_FLAGS)


def run_live(page, timeout_ms: int) -> None:
    """Press Run on the live tab and wait for chips, the round table, a plot and the final status."""
    page.click("#run")
    page.wait_for_selector("#chips-box .chip-correction, #chips-box .chip-bonus", timeout=timeout_ms)
    wait_for_text(page, "#round-table", "[", timeout_ms)  # a matches cell like [T,F]
    page.wait_for_selector("#alpha-plot .main-svg", timeout=timeout_ms)
    wait_for_text(page, "#status", "done", timeout_ms)


def wait_for_text(page, selector: str, text: str, timeout_ms: int) -> None:
    """Wait until the element `selector` shows `text` (Gradio's tables keep hidden measuring rows)."""
    page.wait_for_function("([s, t]) => (document.querySelector(s)?.innerText || '').includes(t)", arg=[selector, text],
                           timeout=timeout_ms)


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def run_compare(page, timeout_ms: int) -> None:
    open_tab(page, "Aligned vs unaligned")
    page.click("#compare-run")
    wait_for_text(page, "#compare-status", "done", timeout_ms)
    page.wait_for_selector("#compare-plot .main-svg", timeout=timeout_ms)


def run_theory(page, timeout_ms: int, k_max: int = 4) -> None:
    """Sweep k = 1..k_max (of the sweep's k values) on the theory tab."""
    open_tab(page, "Theory vs measurement")
    page.locator("#k-max input[type=number]").fill(str(k_max))
    page.locator("#k-max input[type=number]").press("Enter")
    page.click("#sweep-run")
    wait_for_text(page, "#sweep-status", "done", timeout_ms)
    page.wait_for_selector("#theory-plot .main-svg", timeout=timeout_ms)


def screenshots(url: str, out_dir: str | Path, tabs: tuple[str, ...] = ("live", "compare", "theory"),
                timeout_ms: int = 600_000) -> list[Path]:
    """Run each of `tabs` once and save one full-page PNG per tab into `out_dir`; return the paths."""
    from playwright.sync_api import sync_playwright

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    saved = []
    with sync_playwright() as playwright:
        browser = open_browser(playwright)
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(url)
        runs = {"live": run_live, "compare": run_compare, "theory": run_theory}
        for name in tabs:
            runs[name](page, timeout_ms)
            path = out_dir / f"{name}.png"
            page.screenshot(path=str(path), full_page=True)
            saved.append(path)
        browser.close()
    return saved


if __name__ == "__main__":
    chosen = tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else ("live", "compare", "theory")
    for saved_path in screenshots(sys.argv[1], sys.argv[2], chosen):
        print(saved_path)
