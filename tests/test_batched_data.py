"""Batched target generation of training data: left padding, one batch, the same greedy rows as one at a time."""
import json

import pytest
import torch

from specdec.testing import tiny_model
from specdec.training.distill import cached_examples, generate_batched, generate_examples

PROMPTS = [[1, 5, 9], [1, 7, 3, 19, 22, 4], [1, 30], [1, 8, 8, 8, 2, 11, 40]]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_batched_rows_equal_one_at_a_time_in_float32(arch):
    model = tiny_model(arch, seed=4)
    batched = generate_batched(model, PROMPTS, max_new_tokens=12)
    alone = generate_examples(model, PROMPTS, max_new_tokens=12)
    assert [e.completion_ids for e in batched] == [e.completion_ids for e in alone]
    assert [e.prompt_ids for e in batched] == PROMPTS


def test_cached_batched_data_has_its_own_file(tmp_path):
    model = tiny_model("llama", seed=4)
    one = cached_examples(model, PROMPTS, tmp_path, max_new_tokens=6)
    batched = cached_examples(model, PROMPTS, tmp_path, max_new_tokens=6, batch_size=3)
    assert [e.completion_ids for e in batched] == [e.completion_ids for e in one]
    files = sorted(tmp_path.glob("*.jsonl"))
    assert len(files) == 2 and all(len(f.read_text().splitlines()) == 4 for f in files)
    assert json.loads(files[0].read_text().splitlines()[0])["source"] == "target"


def test_batched_sampling_is_reproducible_and_leaves_the_global_random_state_alone():
    model = tiny_model("llama", seed=4)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = generate_batched(model, PROMPTS * 2, max_new_tokens=8, temperature=1.0, seed=5)
    assert torch.equal(torch.get_rng_state(), before)
    again = generate_batched(model, PROMPTS * 2, max_new_tokens=8, temperature=1.0, seed=5)
    other = generate_batched(model, PROMPTS * 2, max_new_tokens=8, temperature=1.0, seed=6)
    greedy = generate_batched(model, PROMPTS * 2, max_new_tokens=8)
    rows = lambda examples: [e.completion_ids for e in examples]  # noqa: E731
    assert rows(first) == rows(again)
    assert rows(first) != rows(other) and rows(first) != rows(greedy)
    assert rows(greedy)[:4] == rows(greedy)[4:]  # greedy: a repeated prompt gives the same row
    assert rows(first)[:4] != rows(first)[4:]  # sampled: each row draws its own tokens
