"""Batched target generation of training data: left padding, one batch, the same greedy rows as one at a time."""
import json

import pytest

from specdec.distill import cached_examples, generate_batched, generate_examples
from specdec.testing import tiny_model

PROMPTS = [[1, 5, 9], [1, 7, 3, 19, 22, 4], [1, 30], [1, 8, 8, 8, 2, 11, 40]]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_batched_rows_equal_one_at_a_time_in_float32(arch):
    model = tiny_model(arch, seed=4)
    batched = generate_batched(model, PROMPTS, max_new_tokens=12)
    alone = generate_examples(model, PROMPTS, max_new_tokens=12)
    assert [e.completion_ids for e in batched] == [e.completion_ids for e in alone]
    assert [e.prompt_ids for e in batched] == PROMPTS


def test_cached_batched_data_has_its_own_file_and_refuses_sampling(tmp_path):
    model = tiny_model("llama", seed=4)
    one = cached_examples(model, PROMPTS, tmp_path, max_new_tokens=6)
    batched = cached_examples(model, PROMPTS, tmp_path, max_new_tokens=6, batch_size=3)
    assert [e.completion_ids for e in batched] == [e.completion_ids for e in one]
    files = sorted(tmp_path.glob("*.jsonl"))
    assert len(files) == 2 and all(len(f.read_text().splitlines()) == 4 for f in files)
    assert json.loads(files[0].read_text().splitlines()[0])["source"] == "target"
    with pytest.raises(ValueError, match="greedy only"):
        cached_examples(model, PROMPTS, tmp_path, max_new_tokens=6, temperature=1.0, batch_size=2)
