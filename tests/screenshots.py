"""Drive the dashboard in headless Chromium: run each tab, wait for its results, save screenshots.

Used by tests/test_browser.py and to make the screenshots in docs/:
    cd tests && python -m screenshots http://127.0.0.1:7860 ../docs/screenshots [recorded,live,compare,theory,hardware]
    cd tests && python -m screenshots http://127.0.0.1:7860 ../docs/screenshots teach  # step-through, position, waterfall
    cd tests && python -m screenshots http://127.0.0.1:7860 ../docs aligned  # prepare, distil, compare-aligned.png
    cd tests && python -m screenshots http://127.0.0.1:7860 ../docs compare:NAME "PROMPT"  # compare tab as is, NAME.png
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"  # Debian's chromium (apt-get install -y chromium)
HEADLESS_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1400, "height": 1000}


@contextlib.contextmanager
def page_at(url: str):
    """A headless Chromium page of VIEWPORT size showing `url`; the browser closes on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=HEADLESS_FLAGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(url)
            yield page
        finally:
            browser.close()
    

def run_live(page, timeout_ms: int) -> None:
    """Press Run on the live tab and wait for chips, the round table, a plot and the final status (of this run, not
    of a recording shown before it: its label goes when the run starts)."""
    page.click("#run")
    page.wait_for_selector("#recorded", state="hidden", timeout=timeout_ms)
    page.wait_for_selector("#chips-box .chip-correction, #chips-box .chip-bonus", timeout=timeout_ms)
    wait_for_text(page, "#round-table", "[", timeout_ms)  # a matches cell like [T,F]
    page.wait_for_selector("#alpha-plot .main-svg", timeout=timeout_ms)
    wait_for_text(page, "#status", "done", timeout_ms)


def run_recorded(page, timeout_ms: int) -> None:
    """The live tab as the page opens: the preset's recorded run, labelled with where and when it ran."""
    wait_for_text(page, "#recorded", "Recorded on", timeout_ms)
    page.wait_for_selector("#alpha-plot .main-svg", timeout=timeout_ms)


def wait_for_text(page, selector: str, text: str, timeout_ms: int) -> None:
    """Wait until the element `selector` shows `text` (Gradio's tables keep hidden measuring rows)."""
    page.wait_for_function("([s, t]) => (document.querySelector(s)?.innerText || '').includes(t)", arg=[selector, text],
                           timeout=timeout_ms)


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def run_compare(page, timeout_ms: int, prompt: str | None = None) -> None:
    """Run the compare tab's default columns (on `prompt` instead of the default one when given)."""
    open_tab(page, "Aligned vs unaligned")
    if prompt is not None:
        page.locator("#compare-prompt textarea").fill(prompt)
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


def run_hardware(page, timeout_ms: int) -> None:
    """Open the Hardware tab and press Measure: the live tab's pair loaded and calibrated (or read back)."""
    open_tab(page, "Hardware")
    wait_for_text(page, "#hardware-device", "vector features", timeout_ms)  # opening the tab reads, nothing else
    page.click("#hardware-measure")
    wait_for_text(page, "#hardware-costs", "one-token target step", timeout_ms)
    wait_for_text(page, "#hardware-curve", "v(n)", timeout_ms)


STEP_READ = """e => ({round: +e.dataset.round, accepted: +e.dataset.accepted, target: +e.dataset.targetToken,
    drafts: [...e.querySelectorAll('.draft-token')].map(c => +c.dataset.tokenId),
    top1: [...e.querySelectorAll('.target-top1')].map(c => +c.dataset.tokenId),
    p_draft: [...e.querySelectorAll('.p-draft')].map(c => +c.dataset.value)})"""  # what one shown round says


def choose_k(page, k: int) -> None:
    """Pick a fixed k in the live tab's k dropdown."""
    box = page.locator("#k input")
    box.click()
    box.fill(str(k))
    page.get_by_role("option", name=str(k), exact=True).click()


def run_step(page, timeout_ms: int, rounds: int = 3) -> list[dict]:
    """Start the step-through and press Next round until `rounds` rounds were shown; what each round showed."""
    shown = []
    for index in range(1, rounds + 1):
        page.click("#step-start" if index == 1 else "#step-next")
        page.wait_for_selector(f'#step-panel #step-round[data-round="{index}"]', timeout=timeout_ms)
        shown.append(page.locator("#step-panel #step-round").evaluate(STEP_READ))
    return shown


def run_position(page, timeout_ms: int, round_index: int = 1, position: int = 1) -> str:
    """Show one position of the step-through; return its text line."""
    for selector, value in (("#position-round", round_index), ("#position-index", position)):
        page.locator(f"{selector} input").fill(str(value))
        page.locator(f"{selector} input").press("Tab")
    page.click("#position-show")
    wait_for_text(page, "#position-text", f"Round {round_index}, position {position}", timeout_ms)
    page.wait_for_selector("#position-plot .main-svg", timeout=timeout_ms)
    return page.locator("#position-text").inner_text()


def teaching_screenshots(url: str, out_dir: str | Path, timeout_ms: int = 600_000) -> list[Path]:
    """step-through.png, position.png (sampling, a rejected position when there is one) and waterfall.png."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with page_at(url) as page:
        choose_k(page, 4)
        run_live(page, timeout_ms)
        page.wait_for_selector("#waterfall-plot .main-svg", timeout=timeout_ms)
        page.locator("#waterfall-plot").screenshot(path=str(out_dir / "waterfall.png"))
        page.get_by_label("sampling").check()
        shown = run_step(page, timeout_ms, rounds=1)
        while shown[-1]["accepted"] == len(shown[-1]["drafts"]) and len(shown) < 12:  # find a rejection
            page.click("#step-next")
            page.wait_for_selector(f'#step-panel #step-round[data-round="{len(shown) + 1}"]', timeout=timeout_ms)
            shown.append(page.locator("#step-panel #step-round").evaluate(STEP_READ))
        page.locator("#step-panel").screenshot(path=str(out_dir / "step-through.png"))
        last = shown[-1]
        position = min(last["accepted"] + 1, len(last["drafts"]) + 1)
        run_position(page, timeout_ms, last["round"], position)
        page.locator("#position-plot").screenshot(path=str(out_dir / "position.png"))
    return [out_dir / name for name in ("step-through.png", "position.png", "waterfall.png")]


def prepare_and_distil(page, timeout_ms: int, name: str = "tiny-aligned") -> None:
    """Open the compare tab's prepare panel, transplant the default other-family draft, distil it, wait for it."""
    open_tab(page, "Aligned vs unaligned")
    page.get_by_text("Prepare an aligned draft").click()
    page.locator("#prepare-name textarea, #prepare-name input").first.fill(name)
    page.click("#prepare-run")
    wait_for_text(page, "#prepare-status", "prepared", timeout_ms)
    page.click("#distil-run")
    wait_for_text(page, "#distil-jobs", "distilled (", timeout_ms)


def aligned_screenshot(url: str, out_dir: str | Path, timeout_ms: int = 600_000) -> list[Path]:
    """compare-aligned.png: an aligned draft prepared and distilled in the app, then the compare tab after a
    reload (its default columns: same-family draft, the other family's draft with naive ids, the distilled one)."""
    path = Path(out_dir) / "compare-aligned.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    with page_at(url) as page:
        prepare_and_distil(page, timeout_ms)
        page.reload()
        run_compare(page, timeout_ms)
        page.get_by_text("Prepare an aligned draft").click()
        page.screenshot(path=str(path), full_page=True)
    return [path]


def compare_screenshot(url: str, path: Path, prompt: str, timeout_ms: int = 1_200_000) -> list[Path]:
    """The compare tab with its default columns (the aligned draft among them when one is registered) on `prompt`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with page_at(url) as page:
        run_compare(page, timeout_ms, prompt)
        page.screenshot(path=str(path), full_page=True)
    return [path]


def screenshots(url: str, out_dir: str | Path, tabs: tuple[str, ...] = ("live", "compare", "theory"),
                timeout_ms: int = 600_000) -> list[Path]:
    """Run each of `tabs` once and save one full-page PNG per tab into `out_dir`; return the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    saved = []
    with page_at(url) as page:
        runs = {"recorded": run_recorded, "live": run_live, "compare": run_compare, "theory": run_theory,
                "hardware": run_hardware}
        for name in tabs:
            runs[name](page, timeout_ms)
            path = out_dir / f"{name}.png"
            page.screenshot(path=str(path), full_page=True)
            saved.append(path)
    return saved


if __name__ == "__main__":
    chosen = tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else ("live", "compare", "theory")
    if chosen == ("teach",):
        saved = teaching_screenshots(sys.argv[1], sys.argv[2])
    elif chosen == ("aligned",):
        saved = aligned_screenshot(sys.argv[1], sys.argv[2])
    elif chosen[0].startswith("compare:"):
        saved = compare_screenshot(sys.argv[1], Path(sys.argv[2]) / f"{chosen[0].removeprefix('compare:')}.png",
                                   sys.argv[4])
    else:
        saved = screenshots(sys.argv[1], sys.argv[2], chosen)
    for saved_path in saved:
        print(saved_path)
