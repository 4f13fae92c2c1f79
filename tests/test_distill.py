"""Distillation loss (hand-checked), masking, soft labels, data cache, checkpoint/resume, and a short run
that raises held-out acceptance on tiny random models."""
import copy
import math

import pytest
import torch

from specdec.testing import tiny_model
from specdec.training import distill as distill_module
from specdec.training.distill import (DistillConfig, Example, cached_examples, distill, distill_loss,
                                      generate_examples, make_batch, soft_labels, speculative_distill_loss)


def softmax(values):
    exps = [math.exp(v) for v in values]
    return [e / sum(exps) for e in exps]


def test_loss_equals_a_hand_computation():
    target, draft, label, t, a = [1.0, 2.0, 0.0], [0.5, 0.0, 1.5], 1, 2.0, 0.7
    p_target = softmax([v / t for v in target])
    p_draft = softmax([v / t for v in draft])
    ce = -math.log(softmax(draft)[label])
    kl = sum(p * math.log(p / q) for p, q in zip(p_target, p_draft))
    expected = (1 - a) * ce + a * t * t * kl
    loss = speculative_distill_loss(torch.tensor([[target]]), torch.tensor([[draft]]), torch.tensor([[label]]),
                                    temperature=t, alpha=a)
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    tv = 0.5 * sum(abs(p - q) for p, q in zip(p_target, p_draft))
    loss_tv = speculative_distill_loss(torch.tensor([[target]]), torch.tensor([[draft]]), torch.tensor([[label]]),
                                       temperature=t, alpha=1.0, kind="tv")
    assert float(loss_tv) == pytest.approx(tv, rel=1e-5)


@pytest.mark.parametrize("kind", ["forward_kl", "reverse_kl", "tv"])
def test_loss_is_zero_when_draft_is_target_and_alpha_one(kind):
    logits = torch.randn(2, 5, 11, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(11, (2, 5))
    loss = speculative_distill_loss(logits, logits.clone(), labels, alpha=1.0, kind=kind)
    assert float(loss) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("kind", ["forward_kl", "reverse_kl", "tv"])
def test_padding_is_masked_out_of_every_term(kind):
    g = torch.Generator().manual_seed(1)
    target, draft = torch.randn(1, 4, 7, generator=g), torch.randn(1, 4, 7, generator=g)
    labels = torch.randint(7, (1, 4), generator=g)
    alone = speculative_distill_loss(target, draft, labels, kind=kind)
    garbage = torch.randn(1, 3, 7, generator=g) * 50
    padded = speculative_distill_loss(torch.cat([target, garbage], 1), torch.cat([draft, -garbage], 1),
                                      torch.cat([labels, torch.full((1, 3), -100)], 1), kind=kind)
    assert float(padded) == pytest.approx(float(alone), rel=1e-5)


@pytest.mark.parametrize("kind", ["forward_kl", "reverse_kl", "tv"])
def test_top_k_labels_with_one_id_left_out_are_exact(kind):
    g = torch.Generator().manual_seed(2)
    target, draft = torch.randn(2, 3, 9, generator=g), torch.randn(2, 3, 9, generator=g)
    labels, mask = torch.randint(9, (2, 3), generator=g), torch.ones(2, 3, dtype=torch.bool)
    full = distill_loss(draft, soft_labels(target, 2.0), labels, mask, kind=kind)
    top = distill_loss(draft, soft_labels(target, 2.0, top_k=8), labels, mask, kind=kind)
    coarse = distill_loss(draft, soft_labels(target, 2.0, top_k=3), labels, mask, kind=kind)
    assert float(top.total) == pytest.approx(float(full.total), rel=1e-4)
    assert float(coarse.divergence) <= float(full.divergence) + 1e-6  # coarsening never increases a divergence


def test_bad_hyper_parameters():
    logits, labels = torch.zeros(1, 2, 5), torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="divergence must be"):
        speculative_distill_loss(logits, logits, labels, kind="js")
    with pytest.raises(ValueError, match="alpha"):
        speculative_distill_loss(logits, logits, labels, alpha=1.5)


def test_batch_masks_prompt_and_padding():
    batch = make_batch([Example([5, 6], [7, 8, 9]), Example([5], [4])])
    assert batch.loss_mask.tolist() == [[False, True, True, True, False], [True, False, False, False, False]]
    assert batch.input_ids[0].tolist() == [5, 6, 7, 8, 9] and batch.attention_mask[1].tolist() == [1, 1, 0, 0, 0]


@pytest.mark.parametrize("source", ["target", "draft"])
def test_the_hard_labels_are_the_targets_greedy_tokens_not_the_datas(source):
    """Cross-entropy alone (alpha 0) on a continuation that is never the target's greedy choice: the draft
    learns the target's choices at every position, not the continuation's tokens."""
    target = tiny_model("llama", seed=0, vocab_size=48, hidden=32)
    draft = tiny_model("llama", seed=5, vocab_size=48, hidden=32, layers=1)
    prompt, continuation = [3, 4, 5], []
    for _ in range(5):  # each token differs from what the target would choose after the tokens before it
        continuation.append((int(greedy_tokens(target, prompt + continuation)[-1]) + 7) % 48)
    ids = prompt + continuation
    config = DistillConfig(steps=60, lr=1e-2, batch_size=1, alpha=0.0, top_k=None, eval_every=0)
    distill(target, draft, [Example(prompt, continuation, source)], config=config)
    positions = slice(len(prompt) - 1, len(ids) - 1)  # those that predict a continuation token
    assert greedy_tokens(draft, ids)[positions].tolist() == greedy_tokens(target, ids)[positions].tolist()


def greedy_tokens(model, ids: list[int]) -> torch.Tensor:
    """[L] the model's argmax after each prefix of ids."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].argmax(-1)


def test_target_continuations_are_cached(tmp_path, monkeypatch):
    target = tiny_model("llama", seed=0, vocab_size=48, hidden=32)
    first = cached_examples(target, [[3, 4, 5]], tmp_path, max_new_tokens=6)
    assert len(list(tmp_path.glob("*.jsonl"))) == 1 and len(first[0].completion_ids) >= 1

    def fail(*args, **kwargs):
        raise AssertionError("generated again instead of reading the cache")
    monkeypatch.setattr(distill_module, "generate_examples", fail)
    assert cached_examples(target, [[3, 4, 5]], tmp_path, max_new_tokens=6) == first
    with pytest.raises(AssertionError):
        cached_examples(target, [[3, 4, 5]], tmp_path, max_new_tokens=7)  # another key: not in the cache


def test_resume_continues_exactly(tmp_path):
    target = tiny_model("llama", seed=0, vocab_size=48, hidden=32)
    start = tiny_model("llama", seed=9, vocab_size=48, hidden=32, layers=1)
    data = [Example([3 + i, 4], [5 + i, 6, 7]) for i in range(6)]
    config = DistillConfig(steps=4, lr=1e-2, batch_size=2, top_k=None, eval_every=0, checkpoint_every=2)
    straight = copy.deepcopy(start)
    distill(target, straight, data, config=config)
    half = copy.deepcopy(start)
    distill(target, half, data, config=DistillConfig(**{**config.__dict__, "steps": 2}), checkpoint_dir=tmp_path)
    resumed = copy.deepcopy(start)
    report = distill(target, resumed, data, config=config, checkpoint_dir=tmp_path, resume=True)
    assert report.steps_done == 4 and [r["step"] for r in report.losses] == [1, 2, 3, 4]
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.allclose(a, b, atol=1e-5)


def test_distillation_raises_held_out_acceptance():
    """A random 1-layer draft learns to agree with a random 2-layer target on its own continuations."""
    target = tiny_model("llama", seed=0, vocab_size=64, hidden=32)
    draft = tiny_model("llama", seed=5, vocab_size=64, hidden=32, layers=1)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 64, (5,), generator=g).tolist() for _ in range(20)]
    data = generate_examples(target, prompts[:16], max_new_tokens=16)
    steps = []
    config = DistillConfig(steps=150, lr=3e-3, batch_size=8, top_k=16, eval_every=0, eval_max_new_tokens=16)
    report = distill(target, draft, data, config=config, eval_prompts=prompts[16:],
                     progress=lambda step, total, record: steps.append(step))
    before, after = report.evals[0], report.evals[-1]
    assert steps == list(range(1, 151)) and report.losses[-1]["loss"] < report.losses[0]["loss"]
    assert after["acceptance_rate"] > before["acceptance_rate"] + 0.3
    assert after["mean_accepted_length"] > before["mean_accepted_length"] + 0.5


def test_the_distill_command_defaults_are_the_config_defaults():
    from specdec.cli import build_parser
    from specdec.cli.distill import config_from

    args = build_parser().parse_args(["distill", "--target", "t", "--draft", "d", "--out", "o"])
    assert config_from(args) == DistillConfig()  # one default per setting (batch size 4, not 2 in the command)


def test_four_bit_values_take_16_levels_per_group_from_its_minimum_to_its_maximum():
    from specdec.models.quant4 import GROUP_SIZE, four_bit_values

    weight = torch.randn(48, 4 * GROUP_SIZE, generator=torch.Generator().manual_seed(0))
    values = four_bit_values(weight)
    groups, original = values.view(48, 4, GROUP_SIZE), weight.view(48, 4, GROUP_SIZE)
    step = (original.amax(-1) - original.amin(-1)) / 15  # [48, 4]
    assert all(len(torch.unique(g)) <= 16 for g in groups.flatten(0, 1))
    assert torch.allclose(groups.amin(-1), original.amin(-1), atol=1e-6)
    assert torch.allclose(groups.amax(-1), original.amax(-1), atol=1e-6)
    assert ((groups - original).abs() <= step[..., None] / 2 + 1e-6).all()
    assert torch.allclose(four_bit_values(values), values, atol=1e-6)  # on its own grid already


def test_four_bit_training_takes_the_gradient_of_the_4_bit_weights_and_keeps_the_floats():
    from specdec.models.quant4 import four_bit_values
    from specdec.training.distill import four_bit_linears, four_bit_weights

    model = tiny_model("llama", seed=3, vocab_size=64, hidden=32, layers=1)
    ids = torch.tensor([[3, 9, 14, 27, 5]])
    weights = four_bit_linears(model)
    head = model.get_output_embeddings().weight
    assert weights and all(w is not head for w in weights)
    floats = [w.detach().clone() for w in weights]
    with four_bit_weights(weights):
        model(input_ids=ids, labels=ids).loss.backward()
    assert all(torch.equal(w, f) for w, f in zip(weights, floats))  # the float weights back, bit for bit
    rounded = copy.deepcopy(model)
    rounded.zero_grad()
    with torch.no_grad():
        for w in four_bit_linears(rounded):
            w.copy_(four_bit_values(w))
    rounded(input_ids=ids, labels=ids).loss.backward()
    for w, r in zip(weights, four_bit_linears(rounded)):
        assert torch.allclose(w.grad, r.grad, atol=1e-6) and not torch.equal(w, r)


def test_a_checkpoint_from_before_four_bit_training_resumes_as_trained_in_float():
    from dataclasses import asdict

    from specdec.training.distill import DistillReport, resume_conflict

    config = asdict(DistillConfig())
    older = DistillReport({k: v for k, v in config.items() if k != "four_bit"}, 4, 40, 10, data="d")
    assert resume_conflict(older, config | {"four_bit": False}, "d") is None
    assert "four_bit was False there, True now" in resume_conflict(older, config | {"four_bit": True}, "d")


def test_four_bit_weights_keep_a_bfloat16_models_dtype():
    from specdec.training.distill import four_bit_linears, four_bit_weights

    model = tiny_model("llama", seed=3, vocab_size=64, hidden=32, layers=1).to(torch.bfloat16)
    weights = four_bit_linears(model)
    with four_bit_weights(weights):
        assert all(w.dtype == torch.bfloat16 for w in weights)
        model(input_ids=torch.tensor([[3, 9, 14]]))
