"""Vector math through the real codegen path (vector loop and scalar tail) against eager,
over inputs covering the whole float range."""

import pytest
import torch

from nncfuse.tensorexpr import expr as E
from nncfuse.tensorexpr.buffer import Buf
from nncfuse.tensorexpr.codegen import llvm_jit, llvm_math, vecmath
from nncfuse.tensorexpr.codegen.llvm_codegen import compile_stmt
from nncfuse.tensorexpr.codegen.llvm_jit import vector_bits
from nncfuse.tensorexpr.dtype import from_torch
from nncfuse.tensorexpr.loopnest import compute
from nncfuse.tensorexpr.passes.flatten_indices import flatten_indices
from nncfuse.tensorexpr.passes.simplify import simplify
from nncfuse.tensorexpr.passes.vectorize import vectorize_inner_loops

UNARY = [
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
    "atanh", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "erf", "erfc", "lgamma",
]
BINARY = ["atan2", "pow", "fmod", "hypot"]
N = (1 << 15) + 5  # a scalar tail after the vector loop


def whole_range(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    int_type = torch.int32 if dtype == torch.float32 else torch.int64
    info = torch.iinfo(int_type)
    bits = torch.randint(info.min, info.max, (N // 2,), generator=g, dtype=torch.int64)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1.0, -1.0,
                            0.5, 2.0, 88.7, -103.9, 710.0, -745.0], dtype=dtype)
    x = torch.cat([special, bits.to(int_type).view(dtype),
                   torch.randn(N // 2, generator=g, dtype=dtype) * 10])
    return x[:N].contiguous()


def run_kernel(name, args):
    dtype = from_torch(args[0].dtype)
    bufs = [Buf.make(f"a{k}", dtype, [N]) for k in range(len(args))]
    out, nest = compute("out", dtype, [N], lambda i: E.call(name, *(E.Load(b, (i,)) for b in bufs)))
    stmt = vectorize_inner_loops(simplify(flatten_indices(nest)), vector_bits())
    assert "Ramp" in str(stmt)
    jit = compile_stmt(simplify(stmt), [*bufs, out], f"check_{name}")
    result = torch.empty(N, dtype=args[0].dtype)
    jit.cfunc(*(a.data_ptr() for a in args), result.data_ptr())
    return result


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", UNARY + BINARY)
def test_close_to_eager_over_the_float_range(name, dtype):
    args = [whole_range(dtype, 0), whole_range(dtype, 1)][: 2 if name in BINARY else 1]
    if name == "fmod":
        # Eager's fmod is SLEEF's in vector loops (NaN for quotients beyond 2**53) and
        # libm's in their tails (exact), which depend on its threads' chunks: compare
        # where the two agree.
        args[1] = torch.where(args[0].abs() / args[1].abs() < 2.0**50, args[1], args[0])
    eager = (getattr(torch, name, None) or getattr(torch.special, name))(*args)
    torch.testing.assert_close(run_kernel(name, args), eager, equal_nan=True)


def test_fast_variants_only_where_measured_safe():
    assert not {"sinh", "cosh", "asinh", "acosh"} & vecmath.FAST_F32
    for name in vecmath.FAST_F32:
        symbol = vecmath.sleef_name(name, "float32", 16)
        assert symbol is None or symbol.endswith("_u35")
    assert vecmath.sleef_name("asinh", "float32", 16) is None  # SLEEF's overflows early



def test_inline_erf_is_within_2_5_ulp_half_an_ulp_near_one_and_exact_at_special_values():
    x = whole_range(torch.float32, 2)
    x[N // 2 :] = torch.linspace(-4.5, 4.5, N - N // 2)  # the fitted range, densely
    got = run_kernel("erf", [x]).double()
    reference = torch.erf(x.double())
    magnitude = reference.float().abs()
    ulp = (torch.nextafter(magnitude, torch.tensor(float("inf"))) - magnitude).double()
    finite = ~reference.isnan()
    error = (got - reference).abs() / ulp
    assert error[finite].max() <= 2.5
    assert error[finite & (x.abs() >= 1)].max() <= 0.75
    assert error[finite & (x.abs() >= 2)].max() <= 0.55  # acos(erf(x)) and 1 - erf(x) rely on it
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf")])
    at = [int((x == v).logical_and(x.signbit() == v.signbit()).nonzero()[0]) for v in special]
    assert got[at].tolist() == [0.0, -0.0, 1.0, -1.0]
    assert got[at].signbit().tolist() == [False, True, False, True]
    assert got[x.isnan()].isnan().all()


def test_inline_erf_at_its_piece_boundaries_and_where_it_rounds_to_one():
    """Each lane picks its piece (|x| < 1, < 2, <= 3.93) and its coefficients: the
    float32 neighbours of the boundaries, in vectors mixing all pieces, within the
    pieces' bounds, and erf(x) = 1 exactly where float64's erf rounds to 1."""
    steps = torch.arange(-(N // 8), N // 8, dtype=torch.int32)
    around = [(torch.tensor(edge).view(torch.int32) + steps).view(torch.float32)
              for edge in (1.0, 2.0, 3.93)]
    x = torch.cat([around[0], -around[1], around[2], torch.linspace(3.5, 5.0, N // 8)])
    x = torch.cat([x, torch.zeros(N - x.numel())])
    x = x[torch.randperm(N, generator=torch.Generator().manual_seed(6))].contiguous()
    got, reference = run_kernel("erf", [x]).double(), torch.erf(x.double())
    magnitude = reference.float().abs()
    ulp = (torch.nextafter(magnitude, torch.tensor(float("inf"))) - magnitude).double()
    error = (got - reference).abs() / ulp
    assert error[x.abs() >= 1].max() <= 0.75
    assert error[x.abs() >= 2].max() <= 0.55
    rounds_to_one = reference.float().abs() == 1
    assert rounds_to_one.any() and (got[rounds_to_one].abs() == 1).all()


@pytest.mark.skipif("avx512f" not in llvm_jit.host_features(), reason="AVX-512's vscalefps")
def test_inline_exp_scales_by_vscalefps_with_the_two_step_products_results(monkeypatch):
    x = whole_range(torch.float32, 3)
    x[: N // 4] = torch.linspace(-110.0, -80.0, N // 4)  # denormal results and their edge
    x[N // 4 : N // 2] = torch.linspace(80.0, 95.0, N // 2 - N // 4)  # overflow to inf
    scaled = run_kernel("exp", [x])
    monkeypatch.setattr(llvm_math, "host_features", lambda: set())
    two_steps = run_kernel("exp", [x])
    assert torch.equal(scaled.isnan(), two_steps.isnan())
    assert torch.equal(scaled.nan_to_num(), two_steps.nan_to_num())
    assert (scaled[: N // 4] == 0).any() and (scaled[: N // 4] < 2.0**-126).logical_and(
        scaled[: N // 4] > 0).any()


def test_inline_exp_within_1_1_ulp_where_its_rounding_switches_and_at_the_range_edges():
    """n = rint(x / ln 2) by adding and subtracting 1.5 * 2**23 (right for |x / ln 2| < 2**22:
    x is clamped to [-104, 88.8] first): around every switch point (k + 1/2) ln 2 the
    reduced argument is at its largest, |r| ~ ln 2 / 2, where the polynomial is least
    accurate; subnormal results within one step of 2**-149; inf, 0 and NaN as eager's."""
    g = torch.Generator().manual_seed(4)
    switch = ((torch.arange(-151, 130, dtype=torch.float64) + 0.5) * 0.6931471805599453).float()
    steps = torch.randint(-40, 41, (N // 2,), generator=g)
    near = switch[torch.randint(0, switch.numel(), (N // 2,), generator=g)].view(torch.int32)
    near = (near + torch.where(near < 0, -steps, steps).to(torch.int32)).view(torch.float32)
    signalling = torch.tensor([0x7FA00001, -0x7FF0], dtype=torch.int32).view(torch.float32)
    x = torch.cat([signalling, whole_range(torch.float32, 5)[: N - N // 2 - 2], near])
    got, want = run_kernel("exp", [x]).double(), torch.exp(x)
    reference = torch.exp(x.double())
    normal = reference.float().abs() >= 2.0**-126
    magnitude = reference.float().abs()
    ulp = (torch.nextafter(magnitude, torch.tensor(float("inf"))) - magnitude).double()
    finite = normal & reference.float().isfinite()
    assert ((got - reference).abs() / ulp)[finite].max() <= 1.1
    assert (got - reference)[~normal & (reference > 0)].abs().max() <= 2.0**-149
    assert torch.equal(got == 0, want == 0) and torch.equal(got.isinf(), want.isinf())
    assert torch.equal(got.isnan(), x.isnan()) and got[:2].isnan().all()
