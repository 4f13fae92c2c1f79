"""Per-forward overhead levers (specdec.lab.levers) and the time breakdown (specdec.lab.breakdown) on tiny models: each
lever keeps the output, the preallocated cache obeys the one rollback rule, the groups partition the profiled
time, and `profile --levers / --breakdown` run. Nothing here asserts a speed."""
import pytest
import torch

from specdec import autoregressive_generate, speculative_generate
from specdec.cli import main
from specdec.core import kv
from specdec.core.kv import CachedLM
from specdec.lab import breakdown, levers
from specdec.lab.levers import PreallocatedCache, PreallocatedLayer, compare_levers, preallocated_cache
from specdec.models import apply_speed_levers, formats, native, quant
from specdec.models.quant import quantize_int8
from specdec.testing import perturbed_copy, tiny_model

CONTEXT = list(range(5, 40))
QUICK_LEVERS = ["static-cache", "sdpa-math"]  # compile takes minutes on 2 cores: tested for its failure line


def model(arch: str = "llama", int8: bool = False, seed: int = 0) -> torch.nn.Module:
    """A tiny model as load_model leaves it (speed levers on), int8 or float32."""
    built = tiny_model(arch, seed)
    apply_speed_levers(built)
    return quantize_int8(built) if int8 else built


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("int8", [False, True])
def test_preallocated_cache_gives_the_same_logits_through_a_rollback(monkeypatch, arch, int8):
    monkeypatch.setattr(kv, "MIN_CAPACITY", 8)  # the storage has to grow several times
    target = model(arch, int8)
    plain = CachedLM(target)
    with preallocated_cache(target):
        preallocated = CachedLM(target)
    assert isinstance(preallocated.cache, PreallocatedCache) and not hasattr(target, "specdec_cache_class")
    for lm in (plain, preallocated):
        lm.prefill(CONTEXT)
    drafts = [7, 8, 9, 10]
    for context in (CONTEXT + drafts, CONTEXT + drafts[:1] + [11], CONTEXT + [12]):  # verify, reject 3, reject all
        feeds = [lm.pending(context) for lm in (plain, preallocated)]  # the same tokens: one rule for both
        logits = [lm.forward(feed, logits_to_keep=len(feed))[0] for lm, feed in zip((plain, preallocated), feeds)]
        assert torch.equal(*logits)
        assert preallocated.cache.get_seq_length() == len(preallocated.token_ids) == len(context)
    assert all(isinstance(layer, PreallocatedLayer) for layer in preallocated.cache.layers)


def test_speculative_output_with_the_preallocated_cache_is_the_target_alone():
    target = model("llama", int8=True)
    draft = quantize_int8(perturbed_copy(model("llama"), noise=0.3, seed=1))
    alone = autoregressive_generate(target, CONTEXT, max_new_tokens=40, eos_token_id=[]).token_ids
    with preallocated_cache(target), preallocated_cache(draft):
        result = speculative_generate(target, draft, CONTEXT, k=4, max_new_tokens=40, eos_token_id=[])
    assert result.token_ids == alone
    assert any(r.num_accepted < len(r.draft_token_ids) for r in result.rounds)  # rollbacks happened


@pytest.mark.parametrize("int8", [False, True])
def test_each_quick_lever_keeps_the_greedy_output(int8):
    rows, failures = compare_levers(model("llama", int8), QUICK_LEVERS, repeats=2)
    assert failures == [] and [row.name for row in rows] == ["none", *QUICK_LEVERS]
    assert all(row.identity == "identical" and len(row.step) == len(row.verify) == 2 for row in rows)


def test_a_lever_that_cannot_run_is_one_line_and_the_others_carry_on(monkeypatch):
    def compiler(*args, **kwargs):
        def compiled(*args, **kwargs):
            raise RuntimeError("no C++ compiler found\nlong details")
        return compiled

    monkeypatch.setattr(torch, "compile", compiler)
    target = model()
    rows, failures = compare_levers(target, ["compile", "static-cache"], repeats=1)
    assert failures == ["compile: not measured (RuntimeError: no C++ compiler found)"]
    assert [row.name for row in rows] == ["none", "static-cache"]
    assert "forward" not in vars(target)  # the class's forward is back


def test_compile_lever_routes_int8_gemms_through_a_traceable_op_with_the_same_bits(monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda forward, **options: forward)  # eager: the routing alone
    target = model("llama", int8=True)
    layers = [m for m in target.modules() if getattr(m, "packed", None) is not None]
    packed = [layer.packed for layer in layers]
    expected = CachedLM(target).forward(CONTEXT, logits_to_keep=3)[0]
    calls, op = [], levers._packed_op
    monkeypatch.setattr(levers, "_packed_op", lambda x_q, key: calls.append(key) or op(x_q, key))
    with levers.compiled_forward(target):
        assert all(isinstance(layer.packed, levers.TraceablePacked) for layer in layers)
        assert torch.equal(CachedLM(target).forward(CONTEXT, logits_to_keep=3)[0], expected)
    assert len(calls) == len(layers)  # every int8 GEMM went through the custom op
    assert [layer.packed for layer in layers] == packed and quant._packed_mm is levers._PACKED_MM  # all restored


def test_identity_names_the_first_differing_token():
    assert levers.identity([1, 2, 3], [1, 2, 3]) == "identical"
    assert levers.identity([1, 2, 4], [1, 2, 3]) == "differs at token 2"
    assert levers.identity([1, 2], [1, 2, 3]) == "differs at token 2"


@pytest.mark.parametrize("new_tokens", [1, 5])
def test_breakdown_groups_partition_the_profiled_total(new_tokens):
    result = breakdown.profile_forwards(model("llama", int8=True), new_tokens, forwards=2)
    assert set(result.groups) == set(breakdown.GROUPS)
    assert sum(result.groups.values()) == pytest.approx(result.total_s, rel=1e-9)
    assert result.groups["GEMM"] > 0 and result.groups["cache ops"] > 0 and result.groups["attention"] > 0
    kernels = ("quantized::linear_dynamic", "onednn::qlinear_pointwise", "aten::_int_mm",
               native.PROFILED_AS)  # whichever runs here
    assert any(result.ops.get((kernel, "GEMM"), 0) > 0 for kernel in kernels)


def test_ops_are_grouped_by_name_and_enclosing_module():
    assert breakdown.group_of("aten::addmm", "linear") == "GEMM"
    assert breakdown.group_of("aten::amax", "linear") == "linear overhead"
    assert breakdown.group_of("aten::cat", "cache") == "cache ops"
    assert breakdown.group_of("aten::mul", "attention") == "norms/rotary/elementwise"
    assert breakdown.group_of("aten::_scaled_dot_product_flash_attention_for_cpu", "attention") == "attention"
    assert breakdown.group_of("aten::embedding", "forward") == "other"


def test_profile_prints_the_lever_table_and_the_breakdown(paths, capsys):
    code = main(["profile", "--target", paths["target"], "--quant", "int8", "--levers", ",".join(QUICK_LEVERS),
                 "--repeats", "1", "--breakdown", "--forwards", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "| step ms | v(5) ms |" in out
    assert out.count("identical") == 3 and "static-cache" in out and "sdpa-math" in out
    assert "one-token step:" in out and "verification, 5 new tokens:" in out and "cache ops" in out
    assert "memory floor: a one-token step reads" in out and "tokens/s for this target in this format" in out


@pytest.mark.parametrize("quant", [None, "int8", "int4-dynamic"])
def test_weight_bytes_count_each_linear_once_in_its_stored_format(quant):
    model = tiny_model("qwen2", seed=0)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    expected = sum(m.weight.numel() * 4 for m in linears)  # float32: 4 bytes a weight
    if quant == "int8":
        expected = sum(m.weight.numel() + 4 * m.out_features for m in linears)  # int8 + a float32 scale a row
        quantize_int8(model)
    elif quant:  # half a byte a weight and two float16 a group of 32, the head too
        expected = sum(m.weight.numel() // 2 + 4 * m.weight.numel() // 32 for m in linears)
        formats.to_format(model, quant)
    assert breakdown.weight_bytes_per_step(model) == expected


@pytest.mark.parametrize("faster", ["mv", "sum"])
def test_the_read_speed_is_the_faster_of_a_matrix_vector_product_and_a_sum(monkeypatch, faster):
    """Either may read at the memory's speed, depending on the CPU and its math library: the floor is the faster."""
    seconds = {"mv": 2.0, "sum": 2.0, faster: 1.0}
    monkeypatch.setattr(breakdown, "time_median", lambda read, repeats, device: (None, seconds[read_name(read)]))
    n_bytes = breakdown.READ_WIDTH * 4 * 8  # 8 rows of float32
    assert breakdown.read_bandwidth(n_bytes) == n_bytes / 1.0


def read_name(read) -> str:
    """"mv" for the matrix-vector product `read_bandwidth` times, "sum" for the plain sum."""
    return "mv" if getattr(read, "func", None) is torch.mv else "sum"


def test_profile_refuses_an_unknown_lever(paths, capsys):
    assert main(["profile", "--target", paths["target"], "--levers", "threads"]) == 1
    assert "unknown lever(s) threads" in capsys.readouterr().err
