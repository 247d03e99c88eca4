"""The flattened one-token step (nn/step.py) against the modules' path it stands beside."""

import pytest
import torch

from minitransformer.nn import kernels as kernels_mod
from minitransformer.nn import linear as linear_mod
from minitransformer.nn import packing as packing_mod
from minitransformer.nn import step as step_mod
from minitransformer.nn.block import DecoderBlock
from minitransformer.nn.kv_cache import KVCache
from minitransformer.nn.positional import ALiBi, RotaryEmbedding
from minitransformer.training.lora import Lora, LoraConfig

C, NH, FF = 32, 4, 64


@pytest.fixture
def plan_runs(monkeypatch):
    """Counts the steps the plan computed."""
    runs = []
    original = step_mod.StepPlan.run

    def run(self, *args):
        runs.append(1)
        return original(self, *args)

    monkeypatch.setattr(step_mod.StepPlan, "run", run)
    return runs


def make_block(seed=0, pos=None, **kw):
    torch.manual_seed(seed)
    positions = dict(rope=RotaryEmbedding(C // NH, max_len=64)) if pos == "rope" else \
        dict(alibi=ALiBi(NH)) if pos == "alibi" else {}
    block = DecoderBlock(C, NH, FF, **positions, **kw).eval()
    with torch.no_grad():  # LayerNorm starts at g = 1, b = 0: make them count
        for name, p in block.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return block


def decode(block, xs, memory=None, mask=None, group=1):
    """Feed xs (B, T, C) one position per call through a fresh cache: (B, T, C)."""
    cache = (KVCache(), KVCache())
    if group > 1:
        block.cross_attn.fill_cache(cache[1], memory, group=group)
    with torch.inference_mode():
        return torch.cat([block(xs[:, t:t + 1], memory, None, mask, cache)[0]
                          for t in range(xs.shape[1])], dim=1)


def source(b=3, s=5):
    g = torch.Generator().manual_seed(1)
    memory = torch.randn(b, s, C, generator=g)
    mask = torch.ones(b, 1, 1, s, dtype=torch.bool)
    mask[0, ..., -2:] = False  # a padded sentence
    return memory, mask


VARIANTS = [dict(), dict(norm_position="pre"), dict(norm="rmsnorm", norm_position="pre"),
            dict(norm="rmsnorm"), dict(activation="gelu"), dict(activation="gelu_tanh"),
            dict(activation="relu2"), dict(activation="swiglu", bias=False),
            dict(n_kv_head=2), dict(qk_norm=True), dict(pos="rope"), dict(pos="alibi"),
            dict(cross_attention=False, norm_position="pre", pos="rope", n_kv_head=1)]


KERNELS = ["packed", "blas", pytest.param("mkl", marks=pytest.mark.skipif(
    not linear_mod.mkl_works(), reason="this PyTorch build has no MKL packed GEMM"))]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("kw", VARIANTS)
def test_the_step_equals_the_modules(monkeypatch, plan_runs, kw, kernel):
    monkeypatch.setattr(linear_mod, "PACK_MIN_ELEMENTS", 1)  # packed copies take part too
    monkeypatch.setattr(kernels_mod, "KERNEL", kernel)
    block = make_block(**kw)
    memory, mask = source() if block.cross_attn is not None else (None, None)
    xs = torch.randn(3, 6, C)
    ref = decode(block, xs, memory, mask)  # outside the scope: the modules
    assert not plan_runs
    with linear_mod.packed_weights(block):
        assert block.step_plan is not None
        y = decode(block, xs, memory, mask)
    assert len(plan_runs) == 6
    assert "step_plan" not in vars(block) and block.step_plan is None  # dropped at the end
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", ["blas", "packed"])
def test_the_steps_exact_gelu_is_pytorchs_own_where_no_product_applies_it(monkeypatch, kernel):
    # after BLAS's product the step applies own_gelu; oneDNN's packed product applies GELU
    # itself (its post-op), so nothing runs after it
    monkeypatch.setattr(linear_mod, "PACK_MIN_ELEMENTS", 1)
    monkeypatch.setattr(kernels_mod, "KERNEL", kernel)
    calls = []

    def counted(x):
        calls.append(x.shape)
        return packing_mod.F.gelu(x)

    monkeypatch.setattr(packing_mod, "own_gelu", counted)
    block = make_block(activation="gelu", cross_attention=False)
    with linear_mod.packed_weights(block):
        decode(block, torch.randn(3, 4, C))
    assert calls == ([(3, FF)] * 4 if kernel == "blas" else [])


def test_beams_grouped_on_their_sentence_keys(plan_runs):
    # Beam search keeps one cross cache row per sentence, serving its g beams as the queries
    # of one attention.
    block = make_block()
    memory, mask = source(b=2)
    xs = torch.randn(6, 4, C)  # 2 sentences x 3 beams
    ref = decode(block, xs, memory, mask, group=3)
    with linear_mod.packed_weights(block):
        y = decode(block, xs, memory, mask, group=3)
    assert len(plan_runs) == 4
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


def test_a_long_decode_grows_the_cache(plan_runs):
    # Past 64 positions the self-attention cache doubles its storage mid-decode.
    block = make_block(norm_position="pre", pos="rope")
    memory, mask = source()
    xs = torch.randn(3, 70, C)
    ref = decode(block, xs, memory, mask)
    with linear_mod.packed_weights(block):
        y = decode(block, xs, memory, mask)
    assert len(plan_runs) == 70
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("change", ["lora", "reference", "reference_rmsnorm", "sharded",
                                    "float64", "hook"])
def test_parts_it_does_not_cover_keep_the_modules(change):
    block = make_block(norm="rmsnorm") if change == "reference_rmsnorm" else \
        make_block(attn_impl="reference" if change == "reference" else "auto")
    if change == "lora":  # peft wraps the target in a class of its own
        pytest.importorskip("peft")
        Lora(block, LoraConfig(lora_rank=2, lora_targets="self_attn.q_proj"))
    if change == "reference_rmsnorm":
        block.res_ffn.norm.reference = True
    if change == "sharded":  # FSDP's DTensor parameters are a subclass like this
        class Sharded(torch.Tensor):
            pass

        proj = block.ffn.proj
        proj.weight = torch.nn.Parameter(proj.weight.detach().as_subclass(Sharded))
    if change == "float64":
        block.double()
    if change == "hook":  # the plan would skip it
        block.ffn.register_forward_hook(lambda *a: None)
    with linear_mod.packed_weights(block):
        assert block.step_plan is None
        assert "step_plan" not in vars(block)  # the block's attributes stay as they were


def test_calls_that_are_not_one_step_keep_the_modules(plan_runs):
    block = make_block()
    memory, mask = source()
    with linear_mod.packed_weights(block), torch.inference_mode():
        cache = (KVCache(), KVCache())
        block(torch.randn(3, 4, C), memory, None, mask, cache)  # a prefill of 4 positions
        _, w_self, w_cross = block(torch.randn(3, 1, C), memory, None, mask, cache,
                                   need_weights=True)
        assert w_self.shape == (3, NH, 1, 5) and w_cross.shape == (3, NH, 1, 5)
        block.train()
        block(torch.randn(3, 1, C), memory, None, mask, cache)
        block.eval()
        block(torch.randn(3, 1, C, dtype=torch.float64).float(), memory, None, mask,
              (KVCache(), KVCache()))  # a step: the plan
    assert len(plan_runs) == 1


def test_measured_kernels_trial_through_the_modules_then_read_the_weights(monkeypatch,
                                                                          plan_runs):
    # While a row count's kernel is on trial the plan's products go through the modules,
    # which time them; once it is chosen they read that kernel's weights directly.
    monkeypatch.setattr(linear_mod, "PACK_MIN_ELEMENTS", 1)
    monkeypatch.setattr(kernels_mod, "KERNEL", "measured")
    monkeypatch.setattr(kernels_mod, "TURN_WARM_SECONDS", 0.0)  # one untimed pass a turn
    block = make_block()
    memory, mask = source()
    passes = len(kernels_mod.trial_schedule(kernels_mod.trial_kernels())) \
        * (1 + kernels_mod.TURN_TIMED)
    xs = torch.randn(3, 2 * passes + 2, C)
    ref = decode(block, xs, memory, mask)
    with linear_mod.packed_weights(block):
        y = decode(block, xs, memory, mask)
        chosen = kernels_mod._choices[block].chosen[(4, torch.get_num_threads())]
        assert set(block.step_plan.parts) == {None, chosen}
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


def test_the_source_mask_is_made_additive_once():
    cache = KVCache()
    mask = torch.tensor([[True, True, False]])[:, None, None, :]  # (1, 1, 1, 3)
    bias = cache.additive(mask, torch.float32)
    assert bias.tolist() == [[[[0.0, 0.0, float("-inf")]]]]
    assert cache.additive(mask, torch.float32) is bias  # the same mask: made once
    assert cache.additive(mask.clone(), torch.float32) is not bias  # rows left: made again


def plan_off(monkeypatch):
    monkeypatch.setattr(step_mod.StepPlan, "of", staticmethod(lambda block: None))


@pytest.mark.parametrize("mode", ["recompute", "roll"])
def test_generation_with_and_without_the_plan(monkeypatch, make_gpt, plan_runs, mode):
    # A GPT sampling past its window (the context shift rebuilds or rolls the cache), in
    # fp32: the same tokens through the plan and through the modules.
    model = make_gpt(scale=0.3, pos_encoding="rope", n_kv_head=1, norm="rmsnorm")
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    out = model.generate(prompt, 40, temperature=0, context_mode=mode)
    assert plan_runs
    plan_off(monkeypatch)
    assert torch.equal(model.generate(prompt, 40, temperature=0, context_mode=mode), out)


def test_translation_with_and_without_the_plan(monkeypatch, plan_runs):
    # Beam search reorders the caches every step; greedy search drops finished sentences.
    from minitransformer.config import Seq2SeqConfig
    from minitransformer.models import Seq2SeqTransformer
    from minitransformer.models.decoding import beam_search, greedy_decode, pad_batch

    torch.manual_seed(0)
    model = Seq2SeqTransformer(Seq2SeqConfig(vocab_size=17, block_size=32, n_layer=2, n_head=2,
                                             n_embd=16, d_ff=32, dropout=0.0)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.5)
    src = pad_batch([[5, 6, 7, 2], [8, 2], [9, 10, 11, 12, 13, 2]], 0)
    runs = [greedy_decode(model, src, max_len=12), beam_search(model, src, 3, max_len=12,
                                                                length_penalty=0.6)]
    assert plan_runs
    plan_off(monkeypatch)
    again = [greedy_decode(model, src, max_len=12), beam_search(model, src, 3, max_len=12,
                                                                 length_penalty=0.6)]
    for a, b in zip(runs, again, strict=True):
        assert a.tokens == b.tokens
        assert a.scores == pytest.approx(b.scores, abs=1e-5)


def test_greedy_search_leaves_the_models_logits_alone():
    # The rules write -inf into a copy: a hook keeping the output head's logits sees them
    # as the model computed them.
    from minitransformer.config import Seq2SeqConfig
    from minitransformer.models import Seq2SeqTransformer
    from minitransformer.models.decoding import greedy_decode, pad_batch

    model = Seq2SeqTransformer(Seq2SeqConfig(vocab_size=17, block_size=32, n_layer=1, n_head=2,
                                             n_embd=16, d_ff=32, dropout=0.0)).eval()
    seen = []
    model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o))
    for scores in (True, False):
        greedy_decode(model, pad_batch([[5, 6, 2]], 0), max_len=4, min_len=2, scores=scores)
    assert seen and all(bool(torch.isfinite(o).all()) for o in seen)
