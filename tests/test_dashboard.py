"""The dashboard's structure: tabs laid out and wired by their own modules, every UI event private but the API,
model work in one shared slot, and the ZeroGPU lease around each decode when `spaces` is importable."""
from __future__ import annotations

import inspect
from functools import partial
from types import SimpleNamespace

import gradio as gr
import pytest

from specdec.dashboard import events, layout
from specdec.dashboard.config import AppConfig
from specdec.dashboard.hub import ModelHub
from specdec.dashboard.tabs import compare, hardware, live, step, theory
from specdec.models import ModelPool

CONFIG = AppConfig(time_limit_s=90)
MODEL_WORK = {"live_decode", "step_start", "step_next", "show_position", "compare", "prepare_aligned",
              "start_distill", "k_sweep", "measure_costs", "speculate"}  # handlers that load or run a model


def name(fn) -> str:
    return fn.func.__name__ if isinstance(fn, partial) else getattr(fn, "__name__", "")


@pytest.fixture(scope="module")
def demo():
    return layout.build_demo(CONFIG, ModelHub(CONFIG, pool=ModelPool()))


def test_every_event_is_private_but_the_speculate_api(demo):
    initial = {component.load_event_to_attach[0] for component in demo.blocks.values()  # Gradio's loaders of
               if getattr(component, "load_event_to_attach", None)}  # callable initial values (gr.State(RunControl))
    wired = [block for block in demo.fns.values() if block.fn not in initial]
    assert len(wired) > 20 and [b.name for b in wired if b.api_visibility != "private"] == ["speculate"]


def test_model_work_shares_the_decode_slot(demo):
    wired = {name(block.fn): block.concurrency_id for block in demo.fns.values()}
    assert MODEL_WORK <= set(wired)
    assert {fn: wired[fn] for fn in MODEL_WORK} == {fn: events.DECODE for fn in MODEL_WORK}


def test_each_tab_module_lays_out_and_wires_its_tab():
    assembly = inspect.getsource(layout.build_demo)
    assert "gr.Tab(" not in assembly and ".click" not in assembly  # the tabs' own modules do both
    for module, tab in ((live, "Live decode"), (compare, "Aligned vs unaligned"), (theory, "Theory vs measurement"),
                        (hardware, "Hardware")):
        source = inspect.getsource(module.build)
        assert f'gr.Tab("{tab}"' in source and "private(" in source
    assert "private(" in inspect.getsource(step.build)


def test_private_keeps_an_event_off_the_api():
    seen = {}
    trigger = lambda fn, inputs, outputs, **options: seen.update(options, fn=fn) or "event"  # noqa: E731
    assert events.private(trigger, print, queue=False) == "event"
    assert seen == {"fn": print, "api_visibility": "private", "queue": False}


def test_without_spaces_a_handler_is_left_as_it_is(monkeypatch):
    monkeypatch.setattr(events, "spaces", None)
    assert events.on_gpu(print, CONFIG) is print


def test_with_spaces_each_decode_runs_under_one_lease_that_covers_its_baseline(monkeypatch):
    leased = {}

    def gpu(duration):
        def lease(fn):
            leased[name(fn)] = duration
            return fn
        return lease

    monkeypatch.setattr(events, "spaces", SimpleNamespace(GPU=gpu))
    layout.build_demo(CONFIG, ModelHub(CONFIG, pool=ModelPool()))
    assert {"live_decode", "compare", "k_sweep", "measure_costs", "speculate", "prepare_aligned"} <= set(leased)
    assert set(leased.values()) == {CONFIG.time_limit_s + events.LOAD_S}  # decode and baseline share the limit


def test_the_hardware_tab_reads_on_opening_and_refresh_and_measures_the_live_pair(demo):
    views = [block for block in demo.fns.values() if name(block.fn) == "hardware_view"]
    assert len(views) == 2 and all(block.concurrency_id != events.DECODE for block in views)  # reads, never waits
    measure = next(block for block in demo.fns.values() if name(block.fn) == "measure_costs")
    assert [c.label for c in measure.inputs] == [c.label for c in views[0].inputs] == ["target model", "draft",
                                                                                        "draft vocabulary"]
    assert len(measure.outputs) == len(views[0].outputs) == 7


def test_the_tab_bar_holds_only_tabs(demo):
    """Gradio's tab bar numbers the children of gr.Tabs as tabs: a State beside them shifted every label after it
    (the bar showed "Live decode" twice and no "Aligned vs unaligned")."""
    [tabs] = [block for block in demo.blocks.values() if isinstance(block, gr.Tabs)]
    assert all(isinstance(child, gr.Tab) for child in tabs.children)
    assert [child.label for child in tabs.children] == ["Live decode", "Aligned vs unaligned",
                                                        "Theory vs measurement", "Hardware"]
