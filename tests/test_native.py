"""The int8 product compiled on this machine (specdec.models.native): exact sums on every path it has, the
weight back bit for bit, built once per machine, and never run where it cannot be built."""
import platform

import pytest
import torch

from specdec.core import timing
from specdec.models import native, quant

needs_build = pytest.mark.skipif(native.library() is None, reason="not built here (no C compiler, or no AVX2)")
x86 = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 build targets")


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A cache of its own and nothing built or timed yet in this process; every cached answer cleared after."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    caches = (native.library, native.build_key, native.tiles, native.tile_rows, native.pass_rows4, quant.exact_for)
    for cached in caches:
        cached.cache_clear()
    yield tmp_path
    for cached in caches:
        cached.cache_clear()


def exact_everywhere(limit: int, on_tiles: bool = False) -> None:
    generator = torch.Generator().manual_seed(0)
    for n, k in ((100, 77), (17, 130), (33, 64), (300, 200)):  # widths and heights off the 16 / 64 blocks
        weight = torch.randint(-limit, limit + 1, (n, k), dtype=torch.int8, generator=generator)
        weight[:3], weight[3:5] = limit, -limit  # extremes
        packed = native.pack(weight)
        assert torch.equal(native.unpack(packed), weight)
        for m in (*range(1, 21), 27, 44, 61):  # 16-row groups: whole, with a part of 11, 12 or 13 rows
            x_q = torch.randint(-127, 128, (m, k), generator=generator).float()
            x_q[0] = -127
            assert torch.equal(native._product(x_q, packed, on_tiles), quant._int_mm(x_q, weight)), (n, k, m)


def built_for(monkeypatch, target: str) -> None:
    """The kernel built for another x86-64 level than this CPU's own (-march=`target`), as on a CPU of that level."""
    monkeypatch.setattr(native, "FLAGS", tuple(f"-march={target}" if f == "-march=native" else f for f in native.FLAGS))


@needs_build
@pytest.mark.parametrize("on_tiles", [False, True])
def test_the_kernel_built_here_gives_torch_int_mm_sums_and_its_weight_back(fresh, on_tiles):
    """Both paths where this CPU has them (asking for tiles without them runs the vector path)."""
    exact_everywhere(quant.INT8_MAX, on_tiles)


@needs_build
@x86
def test_built_for_avx2_without_vnni_the_kernel_is_exact_for_8_bit_weights(fresh, monkeypatch):
    """AVX2's pair product saturates 16 bits on x + 128 for 8-bit weights (fbgemm there is exact for 7-bit ones
    only); the kernel multiplies |x| by w with x's sign instead: exact at 8 bits, so the weight range, and the int8
    model's weights, are those of every other CPU."""
    built_for(monkeypatch, "x86-64-v3")
    assert native.library() is not None and not native.tiles()
    exact_everywhere(quant.INT8_MAX)
    assert quant.exact_for("native", quant.INT8_MAX) and quant.weight_limit() == quant.INT8_MAX


@x86
def test_for_a_cpu_without_avx2_there_is_no_build_and_the_other_kernels_run(fresh, monkeypatch):
    """Plain code, exact at 8 bits by widening, was slower than fbgemm with 7-bit weights, and exact at 8 bits it
    would set the weight range: so there is no build below AVX2, and the range and kernels are the others'."""
    built_for(monkeypatch, "x86-64-v2")
    assert native.compiler() is None or native.library() is None
    assert not quant.exact_for("native", quant.INT8_MAX) and "native" not in quant.kernel_path()


@needs_build
def test_the_kernel_is_built_once_per_machine_and_its_row_counts_timed_once(fresh, monkeypatch):
    native.library()
    rows, per_pass = native.tile_rows(), native.pass_rows4()
    assert len(per_pass) == len(native.PASS_PROBE_ROWS) and set(per_pass) <= set(native.PASS_ROWS_4)
    built = sorted((fresh / "native").iterdir())
    for cached in (native.library, native.tile_rows, native.pass_rows4):
        cached.cache_clear()  # another process on this machine
    monkeypatch.setattr(native, "_timed_tile_rows", lambda: pytest.fail("timed again"))
    monkeypatch.setattr(native, "_timed_pass_rows4", lambda: pytest.fail("timed again"))
    monkeypatch.setattr(native.subprocess, "run", lambda command, **kwargs: pytest.fail("built again"))
    assert native.library() is not None and native.tile_rows() == rows and native.pass_rows4() == per_pass
    assert sorted((fresh / "native").iterdir()) == built


@needs_build
@pytest.mark.parametrize("faster", native.PASS_ROWS_4)
def test_the_rows_a_4_bit_pass_takes_are_the_fastest_timed_here(fresh, monkeypatch, faster):
    """Which of PASS_ROWS_4 the 4-bit product takes is measured on the machine (mocked timings here), never read
    off the CPU's flags; either gives the same bits."""
    timed = []

    def linear4(x, packed, bias, rows):
        timed.append(rows)
        clock[0] += 1.0 if rows == faster else 2.0

    clock = [0.0]
    monkeypatch.setattr(native, "linear4", linear4)
    monkeypatch.setattr(timing, "clock", lambda device: clock[0])
    assert native.pass_rows4() == (faster, faster) and set(timed) == set(native.PASS_ROWS_4)


@needs_build
def test_a_verifications_rows_and_a_prompts_take_the_pass_each_is_timed_fastest_for(fresh, monkeypatch):
    """Timed apart (mocked here): one pass of up to 12 rows where a verification's rows are faster so, passes of 8
    where a prompt's are; a product of 8 rows or fewer is one pass, and none is timed for it."""
    verification = set(native.PASS_PROBE_ROWS[0])

    def linear4(x, packed, bias, rows):
        prompt = x.shape[0] not in verification
        clock[0] += 1.0 if rows == (8 if prompt else 12) else 2.0

    clock = [0.0]
    monkeypatch.setattr(native, "linear4", linear4)
    monkeypatch.setattr(timing, "clock", lambda device: clock[0])
    assert native._pass_rows(5) == 5 and native.pass_rows4.cache_info().currsize == 0
    assert native.pass_rows4() == (12, 8)
    assert [native._pass_rows(m) for m in (8, 9, 11, 12, 13, 16, 64)] == [8, 12, 12, 12, 8, 8, 8]


@pytest.mark.parametrize("compiler", [None, "false"])
def test_without_a_compiler_or_with_a_failing_build_the_kernel_never_runs(fresh, monkeypatch, compiler):
    """No compiler, or one that fails: no kernel, not exact, so never chosen; the int8 path runs on the others."""
    monkeypatch.setattr(native, "compiler", lambda: compiler)
    assert native.library() is None and not native.tiles() and native.tile_rows() is None
    with pytest.raises(RuntimeError):
        native.pack(torch.zeros(16, 64, dtype=torch.int8))
    assert not quant.exact_for("native", quant.INT8_MAX) and "native" not in quant.exact_kernels()
    assert "native" not in quant.kernel_path()


@needs_build
@pytest.mark.parametrize("bias", [False, True])
def test_a_linear_in_one_call_is_bitwise_the_layer_computed_with_torch_ops_around_the_product(fresh, bias):
    """Rows quantized alone (an all-zero row, half-way roundings, magnitudes 1e-3..1e3), the sums, the scales, the
    bias: the fused call's float operations are torch's, in its order, so its bits are `Int8Linear`'s on any kernel."""
    generator = torch.Generator().manual_seed(0)
    for n, k in ((100, 77), (300, 200)):
        layer = quant.Int8Linear(torch.randn(n, k, generator=generator), torch.randn(n, generator=generator)
                                 if bias else None)
        packed = native.pack(layer.int8_weight())
        for m in (1, 5, 9, 20):
            x = torch.randn(m, k, generator=generator) * torch.logspace(-3, 3, m)[:, None]
            x[0] = 0.0
            x[-1, :4] = torch.tensor([0.5, 1.5, -2.5, 127.0]) * x[-1].abs().max() / 127
            x_q, x_scale = quant._quantize_rows(x)
            expected = native.mm(x_q, packed) * layer.weight_scale * x_scale[:, None]
            expected = expected + layer.bias if bias else expected
            assert torch.equal(native.linear(x, packed, layer.weight_scale, layer.bias), expected), (n, k, m)


def product4_everywhere() -> dict:
    """`native.linear4` against its definition: each row quantized alone (symmetric int8, as an int8 Linear's), then
    x_scale * sum over groups of (scale * the exact sum of code * x_q - offset * the sum of x_q), scale and offset
    in float16; and each row computed alone gives the same bits as in any batch (1..26 rows: a draft's proposals,
    catch-ups, verifications and prompts), whatever the rows a pass takes. Returns the outputs, to compare builds."""
    generator = torch.Generator().manual_seed(0)
    outputs = {}
    rows = 26
    for n, k in ((100, 64), (17, 160), (48, 896)):  # heights off the 16-output blocks
        codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=generator)
        scale, offset = torch.rand(n, k // 32, generator=generator), torch.randn(n, k // 32, generator=generator)
        bias = torch.randn(n, generator=generator)
        packed = native.pack4(codes, scale, offset)
        x = torch.randn(rows, k, generator=generator) * torch.logspace(-3, 3, rows)[:, None]
        x_q, x_scale = quant._quantize_rows(x)
        sums = (codes.double()[None] * x_q.double()[:, None]).view(rows, n, -1, 32).sum(-1)  # [M, n, groups], exact
        group_sums = x_q.double().view(rows, 1, -1, 32).sum(-1)  # [M, 1, groups]
        expected = (scale.half().double() * sums - offset.half().double() * group_sums).sum(-1) * x_scale[:, None]
        y = native.linear4(x, packed, bias)
        torch.testing.assert_close(y, (expected + bias).float(), rtol=1e-5, atol=1e-5 * float(expected.abs().max()))
        for m in range(1, rows + 1):
            assert torch.equal(native.linear4(x[:m], packed, bias), y[:m])
            assert torch.equal(native.linear4(x[m - 1:m], packed, bias), y[m - 1:m])
        for per_pass in (1, 3, *native.PASS_ROWS_4):
            assert torch.equal(native.linear4(x, packed, bias, per_pass), y), per_pass
        outputs[(n, k)] = y
    return outputs


@needs_build
def test_a_4_bit_product_is_its_definition_and_each_row_is_computed_alone(fresh):
    product4_everywhere()


@needs_build
@x86
def test_built_for_avx2_the_4_bit_product_gives_the_bits_of_the_build_here(fresh, monkeypatch):
    """The AVX2 path sums the same integers and scales them with the same float operations, in the same order."""
    here = product4_everywhere()
    native.library.cache_clear()
    native.build_key.cache_clear()
    built_for(monkeypatch, "x86-64-v3")
    assert native.library() is not None
    avx2 = product4_everywhere()
    assert all(torch.equal(here[shape], avx2[shape]) for shape in here)
