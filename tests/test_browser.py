"""A real browser (Playwright + Debian's chromium) runs a decode on the tiny models and sees its results."""
from __future__ import annotations

import os
import shutil

import pytest

from test_app_server import app_server  # noqa: F401 - the served app fixture
from screenshots import CHROMIUM, choose_k, page_at, run_hardware, run_live, run_position, run_step

# skipped on a developer machine without chromium; in CI (CI=true) a missing browser is a failure
pytestmark = pytest.mark.skipif(shutil.which(CHROMIUM) is None and not os.environ.get("CI"),
                                reason="needs Debian's chromium: apt-get install -y chromium")
TIMEOUT_MS = 120_000


def test_browser_decode_shows_coloured_chips_round_table_and_plots(app_server, tmp_path):  # noqa: F811
    url, _ = app_server
    with page_at(url) as page:
        run_live(page, TIMEOUT_MS)
        # the whole run's chips, polled rather than read once (one CI run read 2 just after the status said done)
        page.wait_for_function("() => document.querySelectorAll('#chips-box .chip').length > 10", timeout=TIMEOUT_MS)
        colours = {page.locator(f"#chips-box .chip-{kind}").first.evaluate("e => getComputedStyle(e).backgroundColor")
                   for kind in ("correction", "rejected")}
        assert len(colours) == 2 and "rgba(0, 0, 0, 0)" not in colours  # coloured, and differently
        assert "line-through" in page.locator("#chips-box .chip-rejected").first.evaluate(
            "e => getComputedStyle(e).textDecorationLine")
        assert "[" in page.locator("#round-table").inner_text()
        assert page.locator("#histogram-plot .main-svg").count() >= 1
        assert "measured speedup" in page.locator("#stats-box").inner_text()
        page.screenshot(path=str(tmp_path / "live.png"), full_page=True)
    assert (tmp_path / "live.png").stat().st_size > 10_000


def test_browser_step_through_shows_the_engines_rounds_one_by_one(app_server, tmp_path):  # noqa: F811
    """Three clicks, three rounds: drafts, p_draft, the target's top-1 rows and what is kept match the engine."""
    from specdec import speculative_generate
    from specdec.dashboard.config import PROMPTS
    from specdec.models import load_model

    url, paths = app_server
    with page_at(url) as page:
        choose_k(page, 3)
        shown = run_step(page, TIMEOUT_MS, rounds=3)
        text = run_position(page, TIMEOUT_MS, 2, 1)
    int8 = dict(dtype="int8")  # the server's one format (SPECDEC_DTYPE in the app_server fixture)
    engine = speculative_generate(load_model(paths["target"], **int8), load_model(paths["draft"], **int8),
                                  next(iter(PROMPTS.values())), k=3, max_new_tokens=24)
    for index, (view, r) in enumerate(zip(shown, engine.rounds), start=1):
        assert view["round"] == index and view["accepted"] == r.num_accepted and view["target"] == r.target_token_id
        assert view["drafts"] == r.draft_token_ids and view["top1"] == [row[0] for row in r.target_top_ids]
        assert view["p_draft"] == pytest.approx(r.draft_probs, abs=1e-5)
    assert "Round 2, position 1" in text and "Greedy" in text


def test_browser_hardware_tab_shows_the_machine_and_measures_the_pair(app_server):  # noqa: F811
    url, _ = app_server
    with page_at(url) as page:
        run_hardware(page, TIMEOUT_MS)
        assert "vector features" in page.locator("#hardware-device").inner_text()
        assert "asked for (int8)" in page.locator("#hardware-models").inner_text()  # the server's one format
        assert "c = " in page.locator("#hardware-costs").inner_text()
