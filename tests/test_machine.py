"""The hardware panel: `specdec.costs.machine`'s report of the device, each loaded model's weight format and the
pair's v(n) and c, read from memory and the caches without loading or timing anything; and the Hardware tab that
renders it, whose Measure button loads and calibrates the pair. Every timing is mocked (tiny models)."""
import gradio as gr
import pytest
import torch

from specdec.core import hardware
from specdec.costs import calibration, machine
from specdec.dashboard.config import AppConfig
from specdec.dashboard.hub import ModelHub
from specdec.dashboard.tabs import hardware as hardware_tab
from specdec.models import ModelPool, formats
from specdec.models.formats import FormatTiming
from specdec.models.entries import default_name
from specdec.models.loading import architecture
from tiny_models import Progress

TIMINGS = [FormatTiming("float32", 0.030, 0.090), FormatTiming("bfloat16", 0.010, 0.011),
           FormatTiming("int8", 0.015, 0.016), FormatTiming("int8-dynamic", 0.005, 0.012),
           FormatTiming("int4", 0.020, 0.050)]  # each format's step and 5-token forward (s)
STEP_S, VERIFY, DRAFT_S = 0.004, [1.0, 1.1, 1.2, 1.3, 1.5, 1.6, 1.8, 1.9, 2.0], 0.001  # the pair's calibration


@pytest.fixture
def timed(monkeypatch, tmp_path):
    """Every timing replaced by the fixed ones above, each call recorded; a private cache."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    calls = []

    def time_formats(config, candidates, **kwargs):
        calls.append("formats")
        return [t for t in TIMINGS if t.format in candidates]

    def measure_verification(model, n_max, repeats, budget=None):
        calls.append("verification")
        return STEP_S, VERIFY[:n_max], []

    def measure_draft_cost(target_model, drafter, repeats, budget=None):
        calls.append("draft step")
        return DRAFT_S / STEP_S

    monkeypatch.setattr(formats, "time_formats", time_formats)
    monkeypatch.setattr(calibration, "measure_verification", measure_verification)
    monkeypatch.setattr(calibration, "measure_draft_cost", measure_draft_cost)
    return calls


def test_the_report_reads_each_models_format_choice_and_the_pairs_costs_without_measuring(timed, paths):
    pool = ModelPool()
    target = pool.get(paths["target"])
    draft = pool.draft(paths["draft"], target)
    measured = list(timed)
    report = machine.machine_report(pool.held(), target, draft)
    assert timed == measured  # reading the caches times nothing
    rows = report.model_rows()
    assert [(r["model"], r["role"], r["format"]) for r in rows] == [("tiny-target", "target", "int8"),
                                                                     ("tiny-draft", "draft", "int8-dynamic")]
    assert "verification rows are its one-token steps" in rows[0]["why this format"]
    assert "never changes the output" in rows[1]["why this format"]
    by_role = {role: [r for r in report.candidate_rows() if r["role"] == role] for role in ("target", "draft")}
    assert [r["format"] for r in by_role["target"]] == ["int8", "int4"]  # a target's candidates, step + 5-token
    assert [r["chosen"] for r in by_role["target"]] == ["✓", ""]
    assert by_role["target"][0]["step ms"] == 15.0 and by_role["target"][0]["v(5)"] == round(0.016 / 0.015, 2)
    assert by_role["draft"][0]["format"] == "int8-dynamic" and by_role["draft"][0]["chosen"] == "✓"
    assert report.pair.costs is None and report.curve_rows() == []
    assert report.costs_line() == "tiny-target with tiny-draft: v(n) and c not measured on this machine yet"

    calibration.calibrate(target, draft)
    report = machine.machine_report(pool.held(), target, draft)
    assert [r["v(n) target steps"] for r in report.curve_rows()] == VERIFY
    assert report.curve_rows()[4]["ms"] == round(1.5 * STEP_S * 1e3, 2)
    line = report.costs_line()
    assert "v(5) = 1.50" in line and f"c = {DRAFT_S / STEP_S:.3f}" in line
    assert f"k = 4 costs {1.5 + 4 * DRAFT_S / STEP_S:.2f} steps" in line  # v(k+1) + k·c


def test_a_format_asked_for_is_not_called_measured_and_no_pair_is_one_line(timed, paths):
    pool = ModelPool()
    pool.get(paths["target"], dtype="bfloat16")
    report = machine.machine_report(pool.held(), missing="the pair is not in memory")
    assert report.model_rows()[0]["why this format"] == "asked for (bfloat16)" and report.candidate_rows() == []
    assert report.costs_line() == "the pair is not in memory" and report.curve_rows() == [] and timed == []
    empty = machine.machine_report([])
    assert empty.models_line() == "no model in memory yet: a decode loads its pair" and empty.model_rows() == []


def test_a_choice_measured_again_since_the_load_says_so(timed, paths, monkeypatch):
    pool = ModelPool()
    pool.get(paths["target"])  # int8, as measured at its load
    faster_int4 = [FormatTiming("int4", 0.001, 0.002)] + [t for t in TIMINGS if t.format != "int4"]
    monkeypatch.setattr(formats, "time_formats", lambda config, candidates, **kw: [
        t for t in faster_int4 if t.format in candidates])
    formats.choose_format(architecture(paths["target"]), "target", recalibrate=True)
    why = machine.machine_report(pool.held()).model_rows()[0]["why this format"]
    assert why.startswith("measured again since it loaded: int4 now")


def test_the_device_names_the_cpu_its_vector_features_and_torchs_kernels(monkeypatch):
    monkeypatch.setattr(hardware, "cpu", lambda: {"model": "Some CPU", "flags": ["sse2", "avx512f", "avx2", "fma"]})
    device = machine.describe_device("cpu")
    assert device.features == ["avx2", "fma", "avx512f"]  # hardware.VECTOR_FLAGS' order, other flags left out
    assert device.kernels == torch.backends.cpu.get_cpu_capability() and device.threads == torch.get_num_threads()
    assert device.lines()[0].startswith("CPU Some CPU, ") and "(the OS): avx2, fma, avx512f;" in device.lines()[1]
    monkeypatch.setattr(hardware, "gpu", lambda device="cuda": "Some GPU")
    assert machine.describe_device("cuda").lines()[0].startswith("GPU Some GPU (cuda), on a Some CPU")


def test_the_tab_shows_what_is_in_memory_and_measure_loads_and_calibrates_the_pair(timed, paths):
    hub = ModelHub(AppConfig(), pool=ModelPool())
    device, models_line, models, candidates, costs_line, curve, quality = hardware_tab.hardware_view(
        hub, paths["target"], paths["draft"], "auto")
    assert "quality against its float model not measured yet" in quality
    assert "vector features" in device and models_line.startswith("no model in memory") and models.empty
    assert costs_line == hardware_tab.NOT_LOADED and curve.empty
    assert hub.pool.loaded() == [] and timed == []  # opening the tab loads and times nothing
    view = hardware_tab.measure_costs(hub, paths["target"], paths["draft"], "auto", progress=Progress())
    assert list(view[2]["format"]) == ["int8", "int8-dynamic"] and "✓" in list(view[3]["chosen"])
    assert list(view[5]["v(n) target steps"]) == VERIFY and f"c = {DRAFT_S / STEP_S:.3f}" in view[4]
    measured = list(timed)
    again = hardware_tab.hardware_view(hub, paths["target"], paths["draft"], "auto")
    assert again[4] == view[4] and timed == measured  # read back from memory and the cache


def test_bad_input_is_one_clear_line(timed, paths):
    hub = ModelHub(AppConfig(allow_custom_models=False), pool=ModelPool())
    line = hardware_tab.hardware_view(hub, "no-such-model", "lookup", "auto")[4]
    assert line.startswith("unknown model 'no-such-model'") and "\n" not in line
    with pytest.raises(gr.Error, match="unknown model 'no-such-model'"):
        hardware_tab.measure_costs(hub, "no-such-model", "lookup", "auto", progress=Progress())


def test_the_tab_shows_the_default_targets_shipped_quality_without_loading_it(timed):
    hub = ModelHub(AppConfig(), pool=ModelPool())
    quality = hardware_tab.hardware_view(hub, default_name("target"), "lookup", "auto")[6]
    assert f"{default_name('target')} int8 against" in quality and "top-1 agreement" in quality
    assert hub.pool.loaded() == [] and timed == []
