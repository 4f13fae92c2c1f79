"""Soak: a few concurrent gradio_client clients against `python app.py` on 127.0.0.1 with the tiny models, normal
and hostile inputs mixed (huge or token-heavy prompts, unknown or overlong names, file-reading specs, bad numbers,
requests that come through a proxy). Every answer is a result or one clear line; the server never shows a
traceback or its cache, and still answers correctly afterwards. Bounded: CLIENTS x ROUNDS requests, SOAK_S.
Select it with `-m soak` (it also runs with the rest)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from gradio_client import Client

from specdec import autoregressive_generate
from specdec.models import load_model
from test_app_server import ROOT, free_port, wait_until_serving
from tiny_models import write_tiny_models

pytestmark = pytest.mark.soak

CLIENTS = 4  # a normal one, one behind a proxy, two hostile
ROUNDS = 5  # requests per client: the two hostile clients send every HOSTILE input once
SOAK_S = 240  # the whole soak, at most
NEW_TOKENS = 8
PROXIED = {"X-Forwarded-For": "203.0.113.7"}  # what a reverse proxy adds: a public visitor
HOSTILE = [  # (changes to a good request, words of its one-line refusal)
    (dict(prompt="x" * 5000), "this host takes at most 400"),
    (dict(prompt="鬱龘靐齉" * 60), "at most 64 are allowed"),  # 240 characters, far more tokens
    (dict(draft="aligned:nope"), "does not offer aligned draft"),
    (dict(target="m" * 5000), "a target name is at most 4096 characters"),
    (dict(draft="lookup@vocab=/etc/passwd"), "not a JSON draft vocabulary"),
    (dict(target="../../no/such/folder"), "folder not found"),
    (dict(temperature="nan"), "finite number"),
    (dict(k=-3), "k must be"),
    (dict(seed=10**40), "seed must be an integer"),
    (dict(max_new_tokens=10**6), "max new tokens must be an integer in 1..16"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("soak")
    paths = write_tiny_models(folder / "models")
    port = free_port()
    env = os.environ | {"SPECDEC_HOST": "127.0.0.1", "SPECDEC_PORT": str(port), "SPECDEC_MAX_NEW_TOKENS": "16",
                        "SPECDEC_TARGET": paths["target"], "SPECDEC_DRAFT": paths["draft"],
                        "SPECDEC_UNALIGNED": paths["unaligned"], "SPECDEC_QUEUE_SIZE": "32",
                        "SPECDEC_MAX_PROMPT_CHARS": "400", "SPECDEC_MAX_PROMPT_TOKENS": "64",
                        "SPECDEC_TIME_LIMIT_S": "60", "GRADIO_ANALYTICS_ENABLED": "False", "OMP_NUM_THREADS": "1"}
    env.pop("SPECDEC_ALLOW_CUSTOM_MODELS", None)  # the default: custom paths only for requests without a proxy
    log = open(folder / "server.log", "w+")
    process = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                               text=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until_serving(url, process)
        yield url, paths, log
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def ask(url: str, paths: dict, client: int, round_: int) -> tuple[str, object]:
    """("answered", result) or ("refused", message) for request `round_` of `client`: client 0 asks normally,
    client 1 through a proxy, clients 2 and 3 send the hostile inputs."""
    inputs = dict(target=paths["target"], draft=paths["draft"], prompt=f"client {client} asks {round_}", k=3,
                  max_new_tokens=NEW_TOKENS, temperature=0.0, seed=client)
    if client >= 2:
        inputs.update(HOSTILE[(client - 2) * ROUNDS + round_][0])
    try:
        result = Client(url, verbose=False, headers=PROXIED if client == 1 else None).predict(
            *inputs.values(), api_name="/speculate")
        return "answered", result
    except Exception as error:  # noqa: BLE001 - what a client sees, judged by the test
        return "refused", str(error)


def test_concurrent_normal_and_hostile_clients_get_results_or_one_clear_line(server):
    url, paths, log = server
    target = load_model(paths["target"])
    start = time.monotonic()
    jobs = [(c, r) for r in range(ROUNDS) for c in range(CLIENTS)]
    with ThreadPoolExecutor(CLIENTS) as pool:
        outcomes = dict(zip(jobs, pool.map(lambda job: ask(url, paths, *job), jobs)))
    assert time.monotonic() - start < SOAK_S
    for (client, round_), (kind, value) in outcomes.items():
        if client == 1:  # through a proxy: the tiny models are custom paths, off for a public visitor
            assert kind == "refused" and "custom model paths and ids are disabled" in value, value
        elif client >= 2:
            words = HOSTILE[(client - 2) * ROUNDS + round_][1]
            assert kind == "refused" and words in value, (client, round_, value)
        else:
            alone = autoregressive_generate(target, f"client {client} asks {round_}", max_new_tokens=NEW_TOKENS)
            assert kind == "answered" and value["token_ids"] == alone.token_ids, value
        if kind == "refused":
            assert "\n" not in value.strip() and "Traceback" not in value and "/.cache/" not in value, value
    kind, result = ask(url, paths, 0, 0)  # still serving, and correctly
    assert kind == "answered" and len(result["token_ids"]) == NEW_TOKENS
    log.seek(0)
    assert "Traceback" not in log.read()
