"""LLM decoding through the backend: transformers' `model.generate` with the model's forward
compiled by `torch.compile(..., backend="nncfuse")` (benchmarks/generate.py measures it).

Decoding calls the forward once per token, each with a longer cache: a compile per token
would make generation unusable. Prefill and decode compile once each (Dynamo's automatic
dynamic shapes make the decode graph's cache length symbolic, nncfuse gives it dynamic
kernels), later generates reuse them, and every graph runs through nncfuse. Greedy
decoding must pick eager's tokens.
"""

import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

NEW_TOKENS = 12


@pytest.fixture(autouse=True)
def _fresh():
    import nncfuse.backend

    torch._dynamo.reset()
    nncfuse.backend.clear_compiled_graphs()
    yield
    torch._dynamo.reset()


class Counted:
    """A backend that counts the graphs Dynamo hands it."""

    def __init__(self) -> None:
        from nncfuse.backend import nncfuse

        self.backend, self.calls = nncfuse, 0

    def __call__(self, gm, example_inputs):
        self.calls += 1
        return self.backend(gm, example_inputs)


def _tiny_gpt2():
    config = transformers.GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=2,
                                     n_positions=64)
    return transformers.GPT2LMHeadModel(config).eval()


def _tiny_llama():
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize(("build", "extra", "bound"), [
    (_tiny_gpt2, {}, 3),
    # The static cache is allocated inside the first prefill: the second generate's
    # prefill, on an allocated cache, is a third graph (Inductor's too).
    (_tiny_llama, {"cache_implementation": "static"}, 3),
], ids=["gpt2", "llama-static"])
def test_generate_compiles_once_per_phase_and_matches_eager(build, extra, bound):
    torch.manual_seed(0)
    eager = build()
    compiled = copy.deepcopy(eager)
    counted = Counted()
    compiled.forward = torch.compile(compiled.forward, backend=counted)
    ids = torch.randint(0, 97, (1, 8))
    kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                  disable_compile=True, **extra)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = eager.generate(ids, **kwargs)
        first = compiled.generate(ids, **kwargs)
        after_first = counted.calls
        second = compiled.generate(ids, **kwargs)
        after_second = counted.calls
        third = compiled.generate(ids, **kwargs)
    assert expected.shape[1] == ids.shape[1] + NEW_TOKENS
    # Bounded, not one per token: a recompile per call would give at least NEW_TOKENS.
    assert 1 <= after_first <= bound
    assert after_second <= bound
    assert counted.calls == after_second  # steady state: nothing compiles any more
    for out in (first, second, third):
        assert torch.equal(out, expected)
    # Every graph runs through nncfuse: one left to the FX graph (a decode graph whose
    # symbolic sizes TorchScript could not take) runs op by op, slower than eager.
    from nncfuse.backend import compiled_graphs

    assert all(g.program is not None for g in compiled_graphs()), [
        g.reason for g in compiled_graphs()]


@pytest.mark.parametrize("build", [_tiny_gpt2, _tiny_llama], ids=["gpt2", "llama"])
def test_decode_lengths_share_a_dynamic_plan(build):
    """Each decode step has a longer cache (a new signature of the decode graph): past the
    first lengths one dynamic plan serves them all, none runs unfused (a static plan per
    length would reach `max_specializations`, 12, and every later length would run the
    unfused graph). Lengths equal to a model dim are size classes of their own, which that
    plan's kernels admit: they run it too, rather than being profiled and compiled."""
    from nncfuse.backend import compiled_graphs
    from nncfuse.jit.specialize.plans import UnfusedPlan

    torch.manual_seed(0)
    eager = build()
    compiled = copy.deepcopy(eager)
    compiled.forward = torch.compile(compiled.forward, backend="nncfuse")
    ids = torch.randint(0, 97, (1, 5))
    kwargs = dict(max_new_tokens=30, min_new_tokens=30, do_sample=False, disable_compile=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(compiled.generate(ids, **kwargs), eager.generate(ids, **kwargs))
    decode = max((g for g in compiled_graphs() if g.program is not None),
                 key=lambda g: len(g.policy.plans))
    plans = list(decode.policy.plans.values())
    assert len(plans) >= 25
    assert not any(isinstance(p, UnfusedPlan) for p in plans)
    assert len({id(p) for p in plans}) <= 2
    assert any(state.plan is not None for state in decode.policy._classes.values())
