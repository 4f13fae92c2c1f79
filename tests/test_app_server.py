"""`python app.py` as a real server on a free port (tiny models as custom paths); gradio_client calls `speculate`."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from gradio_client import Client

from specdec import autoregressive_generate
from specdec.models import load_model
from tiny_models import write_tiny_models

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 120  # imports of torch + transformers + gradio on a busy 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"app.py exited with {process.returncode}:\n{process.stdout.read()}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"app.py did not serve {url} within {START_TIMEOUT_S} s")


@pytest.fixture(scope="module")
def app_server(tmp_path_factory):
    """(url, tiny model paths): app.py serving the tiny pair, custom model paths allowed, 24-token cap."""
    paths = write_tiny_models(tmp_path_factory.mktemp("tiny"))
    port = free_port()
    env = os.environ | {"SPECDEC_HOST": "127.0.0.1", "SPECDEC_PORT": str(port), "SPECDEC_ALLOW_CUSTOM_MODELS": "1",
                        "SPECDEC_MAX_NEW_TOKENS": "24", "SPECDEC_TARGET": paths["target"],
                        "SPECDEC_DRAFT": paths["draft"], "SPECDEC_UNALIGNED": paths["unaligned"],
                        "GRADIO_ANALYTICS_ENABLED": "False",
                        "SPECDEC_DTYPE": "int8"}  # one format for the server and the test: auto is measured per process
    process = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until_serving(url, process)
        yield url, paths
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_speculate_api_returns_the_result_json_and_greedy_equals_target_alone(app_server):
    url, paths = app_server
    client = Client(url, verbose=False)
    result = client.predict(paths["target"], paths["draft"], "今天天气", 4, 20, 0.0, 0, api_name="/speculate")
    assert set(result) == {"token_ids", "rounds", "stats", "text", "stopped_early"}
    assert len(result["token_ids"]) == 20 and result["stats"]["k"] == 4
    assert sum(len(r["emitted_token_ids"]) for r in result["rounds"]) == 20
    alone = autoregressive_generate(load_model(paths["target"], dtype="int8"), "今天天气", max_new_tokens=20)
    assert result["token_ids"] == alone.token_ids
    assert result["text"] == alone.text


def test_bad_api_input_is_an_error_and_the_server_keeps_serving(app_server):
    url, paths = app_server
    client = Client(url, verbose=False)
    with pytest.raises(Exception, match="k must be .auto. or an integer in 1..10"):
        client.predict(paths["target"], paths["draft"], "hi", 12, 8, 0.0, 0, api_name="/speculate")
    with pytest.raises(Exception, match="max new tokens must be an integer in 1..24"):
        client.predict(paths["target"], paths["draft"], "hi", 2, 500, 0.0, 0, api_name="/speculate")
    result = client.predict(paths["target"], "lookup", "abcabcabc", 3, 6, 0.0, 0, api_name="/speculate")
    assert len(result["token_ids"]) == 6
