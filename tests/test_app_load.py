"""Load test: 8 concurrent gradio_client clients against `python app.py` on 127.0.0.1 with the tiny models.

A small queue (SPECDEC_QUEUE_SIZE=4) and one decode slot: every request is answered with its own prompt's
output (no cross-talk) or refused cleanly (queue full, or a one-line input error); the slot is free
afterwards and the server's memory stays flat.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
from gradio_client import Client

from specdec import autoregressive_generate
from specdec.models import load_model
from test_app_server import ROOT, free_port, wait_until_serving
from tiny_models import write_tiny_models

CLIENTS = 8
ROUNDS = 3  # requests per client
NEW_TOKENS = 12
BAD = {  # client -> (field, value, words of its one-line refusal)
    5: ("temperature", 1e-40, "temperature must be 0"), 6: ("seed", 10**30, "seed must be an integer in"),
    7: ("prompt", "x" * 500, "this host takes at most 300"),
}
REFUSED = ("queue is full",)  # Gradio's busy answer when the bounded queue is full


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    paths = write_tiny_models(tmp_path_factory.mktemp("tiny"))
    port = free_port()
    env = os.environ | {"SPECDEC_HOST": "127.0.0.1", "SPECDEC_PORT": str(port), "SPECDEC_MAX_NEW_TOKENS": "24",
                        "SPECDEC_TARGET": paths["target"], "SPECDEC_DRAFT": paths["draft"],
                        "SPECDEC_UNALIGNED": paths["unaligned"], "SPECDEC_QUEUE_SIZE": "4",
                        "SPECDEC_MAX_PROMPT_CHARS": "300", "SPECDEC_TIME_LIMIT_S": "60",
                        "GRADIO_ANALYTICS_ENABLED": "False", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until_serving(url, process)
        yield url, paths, process.pid
    finally:
        process.terminate()
        process.wait(timeout=30)


def ask(url: str, paths: dict, client: int, round_: int) -> tuple[int, str, object]:
    """(client, "answered" | "refused" | "error", result or message) for one request."""
    inputs = dict(target=paths["target"], draft=paths["draft"], prompt=f"client {client} asks {round_}", k=3,
                  max_new_tokens=NEW_TOKENS, temperature=0.0, seed=client)
    if client in BAD:
        inputs[BAD[client][0]] = BAD[client][1]
    try:
        return client, "answered", Client(url, verbose=False).predict(*inputs.values(), api_name="/speculate")
    except Exception as error:  # noqa: BLE001 - what a client sees, judged below
        message = str(error)
        return client, "refused" if any(r in message.lower() for r in REFUSED) else "error", message


def test_eight_concurrent_clients_are_each_answered_or_refused_cleanly(server):
    url, paths, pid = server
    target = load_model(paths["target"])
    expected = {(c, r): autoregressive_generate(target, f"client {c} asks {r}", max_new_tokens=NEW_TOKENS).token_ids
                for c in range(CLIENTS) for r in range(ROUNDS)}
    ask(url, paths, 0, 0)  # warm: the models load once
    rss_before = psutil.Process(pid).memory_info().rss
    start = time.monotonic()
    with ThreadPoolExecutor(CLIENTS) as pool:
        outcomes = list(pool.map(lambda job: ask(url, paths, *job),
                                 [(c, r) for r in range(ROUNDS) for c in range(CLIENTS)]))
    elapsed = time.monotonic() - start
    rss_after = psutil.Process(pid).memory_info().rss
    kinds = {kind: sum(1 for _, k, _ in outcomes if k == kind) for kind in ("answered", "refused", "error")}
    print(f"\n{len(outcomes)} requests in {elapsed:.1f} s: {kinds}; server RSS {rss_before / 2**20:.0f} -> "
          f"{rss_after / 2**20:.0f} MiB")
    for (client, kind, value), (c, r) in zip(outcomes, [(c, r) for r in range(ROUNDS) for c in range(CLIENTS)]):
        if client in BAD and kind != "refused":
            assert kind == "error" and BAD[client][2] in value and "Traceback" not in value, value
        elif kind == "answered":
            assert value["token_ids"] == expected[(c, r)]  # its own prompt's output: no cross-talk
        else:
            assert kind == "refused", value
    assert kinds["answered"] >= CLIENTS - len(BAD)  # the queue holds most of them
    assert elapsed < 300 and rss_after - rss_before < 200 * 2**20
    _, kind, result = ask(url, paths, 1, 0)  # the slot is free again
    assert kind == "answered" and result["token_ids"] == expected[(1, 0)]
