"""A hosted dashboard's limits, without a server: API inputs fuzzed (each bad one is one clear ValueError),
the time limit and Stop while queued, a worker that always releases its slot, custom models only on loopback."""
from __future__ import annotations

import gc
import math
import shutil
import threading
import time
from pathlib import Path

import gradio as gr
import pytest
from gradio.context import LocalContext

from specdec import speculative_generate
from specdec.core.engine import speculative_rounds
from specdec.core.limits import Budget
from specdec.dashboard import handlers, teach
from specdec.dashboard.config import AppConfig
from specdec.dashboard.hub import ModelHub
from specdec.dashboard.layout import DELETE_CACHE, build_demo, launch_options
from specdec.dashboard.profiles import THIS_MACHINE
from specdec.dashboard.runs import DecodeRequest, RunControl, SEED_MAX, StopToken, stream
from specdec.dashboard.tabs import compare, live, step
from specdec.models import ModelPool, aligned, cache, entries
from specdec.testing import perturbed_copy, tiny_model
from tiny_models import Progress, write_tiny_models

CONFIG = AppConfig(max_new_tokens_cap=16, max_prompt_chars=200)
GOOD = dict(target="t", draft="d", prompt="hello", k=3, max_new_tokens=8, temperature=0.0, top_p=1.0, seed=0)
BAD = [  # (field, value, words of the one-line message)
    ("temperature", 1e-40, "temperature must be 0"), ("temperature", -1, "temperature must be 0"),
    ("temperature", math.nan, "temperature must be a finite number"), ("temperature", "inf", "finite number"),
    ("temperature", 1e308 * 10, "finite number"), ("temperature", "warm", "finite number"),
    ("temperature", [0.5], "finite number"), ("temperature", 11, "temperature must be 0"),
    ("seed", 10**30, "seed must be an integer in 0..9007199254740992"), ("seed", 2**53 + 1, "seed must be"),
    ("seed", -1, "seed must be"), ("seed", 1.5, "seed must be an integer"),
    ("seed", "1e400", "seed must be an integer"),
    ("seed", "9" * 5000, "seed must be an integer"), ("seed", True, "seed must be an integer"),
    ("prompt", 12345, "prompt must be text"), ("prompt", {"a": 1}, "prompt must be text"),
    ("prompt", "x" * 201, "prompt is 201 characters; this host takes at most 200"),
    ("prompt", "   \n\t", "empty prompt"), ("prompt", "bad \ud800 half", "not valid Unicode"),
    ("k", 10**30, "k must be"), ("k", "many", "k must be an integer"), ("k", math.inf, "k must be an integer"),
    ("k", 0, "k must be"), ("k", None, "k must be an integer"),
    ("max_new_tokens", 10**9, "max new tokens must be an integer in 1..16"), ("max_new_tokens", -3, "1..16"),
    ("max_new_tokens", 2.5, "max new tokens must be an integer"),
    ("max_new_tokens", "", "max new tokens must be an integer"),
    ("top_p", 0, "top-p must be in"), ("top_p", 1.5, "top-p must be in"), ("top_p", "nan", "finite number"),
]
ACCEPTED = [("seed", SEED_MAX), ("seed", str(2**53)), ("seed", None), ("seed", ""), ("k", "auto"), ("k", " AUTO "),
            ("k", 4.0), ("temperature", 0.01), ("temperature", "0.7"), ("prompt", "今天天气 🌤 naïve ∑"),
            ("prompt", "x" * 200), ("max_new_tokens", "16")]


def request(**changes) -> DecodeRequest:
    return DecodeRequest.from_inputs(**{**GOOD, **changes}).checked(CONFIG)


@pytest.mark.parametrize("field, value, message", BAD)
def test_each_bad_input_is_one_clear_value_error(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as error:
        request(**{field: value})
    assert "\n" not in str(error.value) and len(str(error.value)) < 200


@pytest.mark.parametrize("field, value", ACCEPTED)
def test_good_inputs_are_kept_exactly(field, value):
    checked = request(**{field: value})
    if field == "seed" and value not in (None, ""):
        assert checked.seed == int(value)  # never rounded through a float


def test_the_time_limit_and_stop_while_queued():
    token = StopToken(Budget(seconds=0.0))
    assert not token.running() and "time limit" in token.reason
    control = RunControl()
    control.queued()
    control.stop()  # pressed while the request waited
    assert control.start().stopped and "before it started" in control.token.reason
    assert not control.start().stopped  # the next request is not affected
    control.stop()  # pressed with nothing queued: only the current flag
    assert control.token.stopped and not control.start().stopped


def test_a_worker_killed_by_a_base_exception_still_releases_the_consumer():
    def decode():
        raise KeyboardInterrupt  # not an Exception: used to leave the consumer waiting forever
        yield
    done = []
    thread = threading.Thread(target=lambda: done.append(pytest.raises(KeyboardInterrupt, list,
                                                                        stream(decode(), StopToken()))))
    thread.start()
    thread.join(10)
    assert done and not thread.is_alive()


def test_stream_stops_the_decode_after_the_round_the_token_is_set_in_and_closes_it_when_left():
    target = tiny_model("llama", seed=0)
    draft = perturbed_copy(target, 0.3)
    token = StopToken()
    updates = stream(speculative_rounds(target, draft, [5, 6, 7], k=2, max_new_tokens=30), token, interval_s=0.0)
    assert len(next(updates)) == 1
    token.stopped = True
    result = list(updates)[-1]
    assert result.stopped_early and len(result.rounds) == 1
    decode = speculative_rounds(target, draft, [5, 6, 7], k=2, max_new_tokens=30)
    left = stream(decode, StopToken(), interval_s=0.0)
    next(left)
    left.close()  # the page went away
    assert decode.gi_frame is None


@pytest.mark.parametrize("host, allowed", [("127.0.0.1", True), ("127.3.4.5", True), ("localhost", True),
                                           ("::1", True), ("0.0.0.0", False), ("192.168.1.9", False), ("::", False)])
def test_custom_models_are_allowed_by_default_only_on_a_loopback_host(host, allowed):
    assert AppConfig.from_env({"SPECDEC_HOST": host}).allow_custom_models is allowed
    assert AppConfig.from_env({"SPECDEC_HOST": host, "SPECDEC_ALLOW_CUSTOM_MODELS": "1"}).allow_custom_models


@pytest.mark.parametrize("environ", [{"GRADIO_SHARE": "true"}, {"GRADIO_SHARE": "1", "SPECDEC_HOST": "localhost"},
                                     {"SPACE_ID": "x/y", "SPECDEC_HOST": "127.0.0.1"}, {"SPECDEC_HOST": "0.0.0.0"}])
def test_a_share_link_or_a_space_makes_even_a_loopback_host_public(environ):
    config = AppConfig.from_env(environ)
    assert config.public and not config.allow_custom_models and not config.allow_training
    chosen = AppConfig.from_env({**environ, "SPECDEC_ALLOW_CUSTOM_MODELS": "1", "SPECDEC_ALLOW_TRAINING": "yes"})
    assert chosen.allow_custom_models and chosen.allow_training  # set explicitly: the host's choice
    assert not AppConfig.from_env({"SPECDEC_HOST": "127.0.0.1"}).public


class Visit:
    """A request as Gradio hands it to an event (only its headers matter here)."""

    def __init__(self, **headers):
        self.headers = {name.replace("_", "-"): value for name, value in headers.items()}

    def __enter__(self):
        self.reset = LocalContext.request.set(self)

    def __exit__(self, *exc):
        LocalContext.request.reset(self.reset)


@pytest.mark.parametrize("headers, public", [
    ({}, False), ({"host": "127.0.0.1:7860"}, False), ({"host": "[::1]:7860"}, False),
    ({"host": "127.0.0.1:7860", "x_forwarded_for": "203.0.113.9"}, True), ({"forwarded": "for=203.0.113.9"}, True),
    ({"host": "127.0.0.1", "x_forwarded_host": "demo.example.org"}, True), ({"host": "demo.example.org"}, True)])
def test_a_request_through_a_proxy_is_public_whatever_the_host(tiny, headers, public):
    _, paths = tiny
    private = ModelHub(AppConfig.from_env({"SPECDEC_HOST": "127.0.0.1"}), pool=None)
    with Visit(**headers):
        if public:
            with pytest.raises(ValueError, match="custom model paths and ids are disabled"):
                private.check(paths["target"], "target")
            with pytest.raises(gr.Error, match="off on this host"):
                compare.start_distill(private, "aligned:any", 1)
        else:
            assert private.check(paths["target"], "target") == paths["target"]
        chosen = ModelHub(AppConfig.from_env({"SPECDEC_HOST": "127.0.0.1", "SPECDEC_ALLOW_CUSTOM_MODELS": "1"}),
                          pool=None)
        assert chosen.check(paths["target"], "target") == paths["target"]  # set explicitly: holds behind a proxy


def test_a_draft_vocabulary_file_is_a_custom_path(tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text('{"token_ids": [1, 2, 3]}')
    public = ModelHub(AppConfig.from_env({"GRADIO_SHARE": "true"}), pool=None)
    spec = f"{public.default('draft')}@vocab={secret}"
    with pytest.raises(ValueError, match="a draft vocabulary file is a custom path, disabled") as error:
        public.check(spec, "draft")
    assert "token_ids" not in str(error.value)
    private = ModelHub(AppConfig.from_env({"SPECDEC_HOST": "127.0.0.1"}), pool=None)
    assert private.check(spec, "draft") == spec


def test_the_live_tab_preselects_the_default_draft_behind_prompt_lookup_unless_the_host_names_one():
    public = ModelHub(AppConfig.from_env({"GRADIO_SHARE": "true"}), pool=None)
    assert public.default_drafter() == public.default("draft") + "+lookup"
    assert [value for _, value in public.choices("draft")].count(public.default_drafter()) == 1  # one of the list
    assert public.check(public.default_drafter(), "draft") == public.default_drafter()  # a locked host loads it
    named = ModelHub(AppConfig.from_env({"GRADIO_SHARE": "true", "SPECDEC_DRAFT": "lookup"}), pool=None)
    assert named.default_drafter() == "lookup"


def test_limits_are_read_from_the_environment():
    config = AppConfig.from_env({"SPECDEC_MAX_PROMPT_CHARS": "99", "SPECDEC_QUEUE_SIZE": "3",
                                 "SPECDEC_TIME_LIMIT_S": "7"})
    assert (config.max_prompt_chars, config.queue_size, config.time_limit_s) == (99, 3, 7)
    with pytest.raises(ValueError, match="SPECDEC_QUEUE_SIZE"):
        AppConfig.from_env({"SPECDEC_QUEUE_SIZE": "0"})


def test_the_sessions_kept_are_bounded_by_the_environment():
    """Gradio keeps every session's state (a copy of the page's config) for an hour: without a bound, each page
    opened or reloaded grows the server by a fraction of a megabyte (tests/test_soak.py measures it)."""
    assert launch_options(AppConfig())["state_session_capacity"] == AppConfig.sessions
    assert launch_options(AppConfig.from_env({"SPECDEC_SESSIONS": "7"}))["state_session_capacity"] == 7
    with pytest.raises(ValueError, match="SPECDEC_SESSIONS"):
        AppConfig.from_env({"SPECDEC_SESSIONS": "0"})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    paths = write_tiny_models(tmp_path_factory.mktemp("tiny"), context=256)
    return ModelHub(CONFIG, pool=ModelPool(budget_bytes=10**9)), paths


@pytest.mark.parametrize("field, value, message", [b for b in BAD[::3] if b[0] != "top_p"])
def test_the_api_handler_refuses_bad_input_as_a_gr_error(tiny, field, value, message):
    hub, paths = tiny
    inputs = {**GOOD, "target": paths["target"], "draft": paths["draft"], field: value}
    inputs.pop("top_p")
    with pytest.raises(gr.Error, match=message.replace("(", r"\(")):
        handlers.speculate(hub, *inputs.values())


def test_the_api_handler_stops_at_the_time_limit(tiny):
    """The limit covers the whole request: past it, even before the first round, the answer is one clear line."""
    hub, paths = tiny
    limited = ModelHub(AppConfig(max_new_tokens_cap=16, time_limit_s=0), pool=hub.pool)
    with pytest.raises(gr.Error, match="time limit of 0 s while loading the target"):
        handlers.speculate(limited, paths["target"], paths["draft"], "hello", 1, 16, 0.0, 0)


class SlowHub(ModelHub):
    """A hub whose calibration takes longer than the host's time limit (a draft column past the deadline)."""

    def costs(self, target, draft, progress=None, budget=Budget()):
        time.sleep(self.config.time_limit_s + 0.2)
        return super().costs(target, draft, progress, budget)


def test_compare_stops_between_columns_and_skips_the_baseline_past_the_time_limit(tiny):
    hub, paths = tiny
    hub.target(paths["target"])  # loaded before the clock starts
    slow = SlowHub(AppConfig(max_new_tokens_cap=16, time_limit_s=1), pool=hub.pool)
    views = list(compare.compare(slow, {}, paths["target"], "hello", 2, 8, THIS_MACHINE, paths["draft"], "as is",
                                  "lookup", "as is", "self:1", "as is"))
    *panels, table, _chart, status = views[-1]
    assert "time limit" in status and "not measured" in status and table is None
    assert panels[1:] == ["<em>not run</em>"] * 2  # the columns after the deadline never ran


def test_a_prompt_is_capped_in_tokens_before_it_is_read(tiny):
    """Rare characters are several tokens each: a prompt within the character cap can still be too long."""
    hub, paths = tiny
    capped = ModelHub(AppConfig(max_new_tokens_cap=16, max_prompt_chars=200, max_prompt_tokens=40), pool=hub.pool)
    prompt = "鬱龘靐齉" * 10  # 40 characters, about three byte-level tokens each
    with pytest.raises(gr.Error, match=r"prompt is \d+ tokens; at most 40"):
        handlers.speculate(capped, paths["target"], paths["draft"], prompt, 2, 4, 0.0, 0)
    assert handlers.speculate(capped, paths["target"], paths["draft"], "hello", 2, 4, 0.0, 0)["token_ids"]


def test_the_compare_error_panel_escapes_names_and_messages(tiny):
    hub, paths = tiny
    *_, (panel, _table, _chart, _status) = compare.compare(hub, {}, paths["target"], "hello", 2, 4, THIS_MACHINE,
                                                            "<img src=x onerror=alert(1)>", "as is")
    assert "<img" not in panel and "&lt;img" in panel


def test_an_unknown_aligned_draft_shows_neither_the_cache_nor_drafts_the_host_does_not_offer(tiny, monkeypatch):
    hub, paths = tiny
    first, second = entries.names()[:2]
    listed = ModelHub(AppConfig(max_new_tokens_cap=16, allowed_models=(first,)), pool=hub.pool)
    monkeypatch.setattr(aligned, "list_aligned", lambda target=None: [aligned.Card(
        name="hidden", target=second, source=second, method="transplant")])  # for a model this host does not offer
    with pytest.raises(gr.Error) as error:
        handlers.speculate(listed, paths["target"], "aligned:nope", "hello", 2, 4, 0.0, 0)
    message = str(error.value)
    assert "does not offer aligned draft 'aligned:nope'" in message
    assert "hidden" not in message and str(cache.root()) not in message


def test_a_model_name_has_a_length_cap(tiny):
    hub, paths = tiny
    with pytest.raises(gr.Error, match="a target name is at most 4096 characters, got 5000") as error:
        handlers.speculate(hub, "x" * 5000, paths["draft"], "hello", 2, 4, 0.0, 0)
    assert "xxxx" not in str(error.value)


def test_errors_never_show_the_cache_location(tiny):
    hub, paths = tiny
    inside = cache.root() / "aligned" / "broken"
    inside.mkdir(parents=True)
    with pytest.raises(gr.Error) as error:
        handlers.speculate(hub, str(inside), paths["draft"], "hello", 2, 4, 0.0, 0)
    assert "<model cache>/aligned/broken" in str(error.value) and str(cache.root()) not in str(error.value)


def test_damaged_weights_in_a_folder_are_one_clear_line(tiny, tmp_path):
    hub, paths = tiny
    broken = tmp_path / "broken"
    shutil.copytree(paths["target"], broken)
    (broken / "model.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b"{not json")
    with pytest.raises(gr.Error, match="cannot load a causal LM and tokenizer from"):
        handlers.speculate(hub, str(broken), paths["draft"], "hello", 2, 4, 0.0, 0)


def test_a_session_s_downloads_stay_in_one_folder_that_goes_with_the_session():
    target = tiny_model("llama", seed=0)
    result = speculative_generate(target, perturbed_copy(target, 0.3), [5, 6, 7, 8], k=3, max_new_tokens=8)
    control, other = RunControl(), RunControl()
    folders = set()
    for session in (control, control, other):
        live.remember(session, result, None, None)
        _figure, json_path, csv_path = live.after_live(session)
        assert Path(json_path).parent == Path(csv_path).parent
        folders.add(Path(json_path).parent)
    mine, theirs = sorted(folders, key=lambda f: f != live.export_folder(control))
    assert len(folders) == 2 and mine.is_dir()  # one folder per session, written again by its next run
    live.forget(control)  # Gradio deletes the session's state
    assert not mine.exists() and theirs.is_dir() and live.after_live(control)[1] == gr.skip()
    del other, session
    gc.collect()  # a session Gradio dropped without deleting it: its folder goes with its RunControl
    assert not theirs.exists()


def test_the_app_deletes_gradio_s_copies_and_each_session_s_state(tiny):
    hub, _ = tiny
    demo = build_demo(CONFIG, hub)
    assert demo.delete_cache == DELETE_CACHE
    states = {type(block.value() if callable(block.value) else block.value).__name__: block
              for block in demo.blocks.values() if isinstance(block, gr.State)}
    assert states["RunControl"].delete_callback is live.forget
    stepping = states["StepSession"]
    assert stepping.delete_callback is step.StepSession.close and stepping.time_to_live == teach.IDLE_S


def test_closing_a_step_through_session_ends_its_decode_and_lets_go_of_its_models(tiny):
    hub, paths = tiny
    session = step.StepSession()
    step.step_start(hub, paths["target"], paths["draft"], "auto", "hello", 2, 12, False, 1.0, 1.0, 0, session,
                     progress=Progress())
    decode = session.stepper._rounds
    assert decode.gi_frame is not None  # paused after its first round, holding its KV cache
    step.StepSession.close(session)
    assert decode.gi_frame is None and session.target is None and session.draft is None
    assert "Start step-through" in step.step_next(session)[2]
