"""Linear: nn.Linear's parameters and results, on the reference path and the packed one."""

from __future__ import annotations

import copy
import itertools
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minitransformer.models.gpt import GPT, GPTConfig
from minitransformer.nn import kernels as kernels_mod
from minitransformer.nn import linear as linear_mod
from minitransformer.nn import packing as packing_mod
from minitransformer.nn.attention import MultiHeadAttention
from minitransformer.nn.block import DecoderBlock
from minitransformer.nn.feedforward import FeedForward
from minitransformer.nn.linear import Linear
from minitransformer.training import device as device_mod


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 24), (1, 1, 24), (5, 24), (2, 3, 24)])
def test_equals_torch_linear(bias, shape):
    ours, theirs = Linear(24, 40, bias=bias), nn.Linear(24, 40, bias=bias)
    theirs.load_state_dict(ours.state_dict())  # same parameters, same names
    x = torch.randn(*shape, requires_grad=True)
    y, ref = ours(x), theirs(x)
    assert y.shape == ref.shape == (*shape[:-1], 40)
    torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-6)
    g, g_ref = torch.autograd.grad(y.sum(), x)[0], torch.autograd.grad(ref.sum(), x)[0]
    torch.testing.assert_close(g, g_ref, rtol=1e-6, atol=1e-6)


class ThreadSensitive(nn.Module):
    """Sleeps longer on one thread (fast_on_many) or on several (not fast_on_many)."""

    def __init__(self, fast_on_many: bool):
        super().__init__()
        self.fast_on_many = fast_on_many

    def forward(self, idx):
        many = torch.get_num_threads() > 1
        time.sleep(0.001 if many == self.fast_on_many else 0.01)


@pytest.mark.parametrize("fast_on_many", [True, False])
def test_decoding_threads_keeps_the_faster_count(monkeypatch, fast_on_many):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        model = ThreadSensitive(fast_on_many).train()
        chosen = device_mod.decoding_threads(model, torch.device("cpu"))
        assert chosen == (2 if fast_on_many else 1) == torch.get_num_threads()
        assert model.training  # put back as it was
    finally:
        torch.set_num_threads(before)


def test_decoding_threads_leaves_omp_num_threads_alone(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    n = torch.get_num_threads()
    assert device_mod.decoding_threads(ThreadSensitive(True), torch.device("cpu")) == n


# ---- the decoding path: weights packed for oneDNN inside ``packed_weights`` ------------------

needs_packing = pytest.mark.skipif(not linear_mod.packing_works(),
                                   reason="this PyTorch build has no oneDNN packed linear")


@pytest.fixture(autouse=True)
def _pack_small(monkeypatch):
    """These tests' layers are tiny: pack them all (outside tests only weights of 256 KB and
    more are packed), and compute from the packed copies (outside tests, where measured
    faster)."""
    monkeypatch.setattr(linear_mod, "PACK_MIN_ELEMENTS", 1)
    monkeypatch.setattr(kernels_mod, "KERNEL", "packed")


TWO = ("packed", "blas")


@pytest.fixture
def measured(monkeypatch):
    """The measured choice between oneDNN's packed copy and BLAS (MKL's packed GEMM, where it
    works, has tests of its own); returns a log of the kernels that ran."""
    monkeypatch.setattr(kernels_mod, "KERNEL", "measured")
    monkeypatch.setattr(kernels_mod, "trial_kernels", lambda rows=1: TWO)
    monkeypatch.setattr(kernels_mod, "TURN_WARM_SECONDS", 0.0)  # one untimed pass a turn
    return []


def timed_calls(log: list, name: str, seconds: float):
    def call():
        log.append(name)
        time.sleep(seconds)
        return name
    return call


def run_passes(choice, modules: dict, n: int, rows: int = 1) -> None:
    """``n`` passes, each a product of every module in order: {module: (packed, blas[,
    mkl])}."""
    x = torch.zeros(rows, 4)
    for _ in range(n):
        for module, calls in modules.items():
            kernels_mod.measured_product(choice, module, x, *calls)


def pass_kernels(kernels: tuple[str, ...]) -> list[str]:
    """The kernel of each pass of a trial of ``kernels`` with one untimed pass a turn
    (TURN_WARM_SECONDS 0, as the ``measured`` fixture sets it)."""
    return [k for k in kernels_mod.trial_schedule(kernels)
            for _ in range(1 + kernels_mod.TURN_TIMED)]


TRIAL_PASSES = len(pass_kernels(TWO))


def test_trial_schedule_puts_every_kernel_at_the_same_mean_and_median_pass():
    assert kernels_mod.trial_schedule(TWO) == ("packed", "blas", "blas", "packed")
    three = pass_kernels(("packed", "blas", "mkl"))
    turn = 1 + kernels_mod.TURN_TIMED
    timed = [i for i in range(len(three)) if i % turn]
    means, medians = set(), set()
    for kernel in ("packed", "blas", "mkl"):
        at = [i for i in timed if three[i] == kernel]
        assert len(at) == 2 * kernels_mod.TURN_TIMED
        means.add(sum(at) / len(at))
        medians.add((at[1] + at[2]) / 2)
    assert len(means) == 1 and len(medians) == 1


def test_a_turn_times_its_passes_once_untimed_ones_took_long_enough(monkeypatch):
    monkeypatch.setattr(kernels_mod, "TURN_WARM_SECONDS", 0.01)
    trial = kernels_mod.Trial(0, ("packed", "blas"))
    for seconds in (0.004, 0.004, 0.004, 0.003, 0.005):  # short passes: three untimed
        assert trial.kernel == "packed"
        trial.pass_ended(seconds)
    assert trial.timed == [("packed", 0.003), ("packed", 0.005)] and trial.kernel == "blas"
    for seconds in (0.05, 0.02, 0.03):  # a long pass is its own warm-up
        trial.pass_ended(seconds)
    assert trial.timed[2:] == [("blas", 0.02), ("blas", 0.03)] and trial.turn == 2


def test_trials_of_many_rows_leave_mkl_out(monkeypatch):
    monkeypatch.setattr(kernels_mod, "mkl_works", lambda: True)
    rows = kernels_mod.MKL_MAX_ROWS
    assert kernels_mod.trial_kernels(rows) == ("packed", "blas", "mkl")
    assert kernels_mod.trial_kernels(2 * rows) == ("packed", "blas")
    monkeypatch.setattr(kernels_mod, "KERNEL", "measured")
    monkeypatch.setattr(kernels_mod, "TURN_WARM_SECONDS", 0.0)
    choice, log = kernels_mod.KernelChoice(), []
    calls = tuple(timed_calls(log, k, 0) for k in ("packed", "blas", "mkl"))
    run_passes(choice, {object(): calls}, 13, rows=2 * rows)  # 4 turns of 3 passes, then
    assert "mkl" not in log and len(choice.chosen) == 1


def test_measured_choice_runs_whole_passes_in_turns_then_keeps_the_faster(measured):
    choice = kernels_mod.KernelChoice()
    first, second = object(), object()
    modules = {first: (timed_calls(measured, "packed", 0.002), timed_calls(measured, "blas", 0)),
               second: (timed_calls(measured, "packed", 0), timed_calls(measured, "blas", 0))}
    run_passes(choice, modules, TRIAL_PASSES)
    # each pass on one kernel (a pass mixing the two would be slower than either)
    assert measured == [kernel for kernel in pass_kernels(TWO) for _ in range(2)]
    turn = 1 + kernels_mod.TURN_TIMED
    assert measured[:2 * turn + 2] == ["packed"] * 2 * turn + ["blas"] * 2
    measured.clear()
    run_passes(choice, modules, 1)  # the pass that closes the last trial pass decides
    assert choice.chosen == {(1, torch.get_num_threads()): "blas"} and not choice.trials
    run_passes(choice, modules, 2)
    assert measured == ["blas"] * 6  # the slower kernel no longer runs
    measured.clear()
    # another row count (to the next power of two), or another model's choice: measured anew
    run_passes(choice, modules, 1, rows=3)
    run_passes(kernels_mod.KernelChoice(), modules, 1)
    assert measured == ["packed"] * 4


def test_the_last_product_of_a_long_pass_counts(measured):
    # twelve layers of products level on both kernels, then an output layer much slower on
    # the packed copy: the pass, whole, is faster on BLAS
    choice = kernels_mod.KernelChoice()
    level = (timed_calls(measured, "packed", 0.0002), timed_calls(measured, "blas", 0.0002))
    modules = {object(): level for _ in range(12)}
    modules[object()] = (timed_calls(measured, "packed", 0.01), timed_calls(measured, "blas", 0))
    run_passes(choice, modules, TRIAL_PASSES + 1)
    assert choice.chosen == {(1, torch.get_num_threads()): "blas"}


def test_a_pass_is_timed_whole_with_the_work_between_its_products(measured):
    # the packed products are the faster, but they slow the work after them (as a kernel
    # that leaves the caches cold would): the passes, whole, are faster on BLAS
    choice, x = kernels_mod.KernelChoice(), torch.zeros(1, 4)
    first, second = object(), object()
    calls = (timed_calls(measured, "packed", 0.0), timed_calls(measured, "blas", 0.002))
    for _ in range(TRIAL_PASSES + 1):
        kernels_mod.measured_product(choice, first, x, *calls)
        time.sleep(0.02 if measured[-1] == "packed" else 0.0)  # the work in between
        kernels_mod.measured_product(choice, second, x, *calls)
    assert choice.chosen == {(1, torch.get_num_threads()): "blas"}


def test_a_trial_whose_anchor_stops_computing_starts_again(measured, monkeypatch):
    # the module that opened the trial computes no more (a LoRA merge put the stacked q, k, v
    # in its place): the trial starts again from the module that does
    monkeypatch.setattr(kernels_mod, "MAX_PASS_PRODUCTS", 5)
    choice, gone, stays = kernels_mod.KernelChoice(), object(), object()
    calls = (timed_calls(measured, "packed", 0.002), timed_calls(measured, "blas", 0.0))
    run_passes(choice, {gone: calls, stays: calls}, 2)
    run_passes(choice, {stays: calls}, 5 + TRIAL_PASSES + 1)
    assert choice.chosen == {(1, torch.get_num_threads()): "blas"} and not choice.trials


def test_thread_count_and_zero_rows(measured, monkeypatch):
    choice, module = kernels_mod.KernelChoice(), object()
    calls = (timed_calls(measured, "packed", 0), timed_calls(measured, "blas", 0))
    assert kernels_mod.measured_product(choice, module, torch.zeros(0, 4), *calls) == "blas"
    assert not choice.trials and not choice.chosen  # an empty product decides nothing
    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)
    kernels_mod.measured_product(choice, module, torch.zeros(5, 4), *calls)
    assert list(choice.trials) == [(8, 7)]  # 5 rows on 7 threads


def test_next_power_of_two():
    assert [packing_mod.next_power_of_two(n) for n in (1, 2, 3, 4, 5, 6, 8, 9)] == \
        [1, 2, 4, 4, 8, 8, 8, 16]


def test_three_kernels_in_turns_then_the_fastest(measured, monkeypatch):
    monkeypatch.setattr(kernels_mod, "trial_kernels", lambda rows=1: ("packed", "blas", "mkl"))
    choice = kernels_mod.KernelChoice()
    calls = (timed_calls(measured, "packed", 0.003), timed_calls(measured, "blas", 0.002),
             timed_calls(measured, "mkl", 0))
    schedule = pass_kernels(("packed", "blas", "mkl"))
    run_passes(choice, {object(): calls}, len(schedule) + 1)
    assert measured[:len(schedule)] == schedule
    assert choice.chosen == {(1, torch.get_num_threads()): "mkl"} and measured[-1] == "mkl"
    # a product without MKL's copy computes the "mkl" kernel's share on BLAS
    assert kernels_mod.measured_product(choice, object(), torch.zeros(1, 4), *calls[:2]) == \
        "blas"


@pytest.mark.parametrize("every_pass", [False, True])
def test_a_pass_that_made_mkl_copies_is_run_again_once(measured, monkeypatch, every_pass):
    # MKL's copies are made at the first product of a scope: a pass that made some is run
    # again, once (where every pass makes them, one scope per pass, every other one counts)
    monkeypatch.setattr(kernels_mod, "trial_kernels", lambda rows=1: ("packed", "blas", "mkl"))
    monkeypatch.setattr(packing_mod, "copies_made", 0)
    made = []

    def mkl():
        if every_pass or not made:
            packing_mod.copies_made += 1
        made.append(1)
        measured.append("mkl")
        time.sleep(0.003 if len(made) == 1 else 0.0)  # the packing, slow

    choice = kernels_mod.KernelChoice()
    calls = (timed_calls(measured, "packed", 0.001), timed_calls(measured, "blas", 0.001), mkl)
    schedule = pass_kernels(("packed", "blas", "mkl"))
    on_mkl = schedule.count("mkl")
    run_passes(choice, {object(): calls}, len(schedule) + 1 + (on_mkl if every_pass else 1))
    assert measured.count("mkl") == (2 * on_mkl if every_pass else on_mkl + 1) + 1
    assert choice.chosen == {(1, torch.get_num_threads()): "mkl"} and not choice.trials


def test_decoding_threads_leaves_the_kernel_trials_to_generation(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(kernels_mod, "KERNEL", "measured")
    monkeypatch.setattr(linear_mod, "PACK_MIN_ELEMENTS", 1)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11))
        device_mod.decoding_threads(model.eval(), torch.device("cpu"), 3)
    finally:
        torch.set_num_threads(before)
    choice = kernels_mod.choice_for(model)
    assert not choice.trials and not choice.chosen  # its probes were timed by no trial


@pytest.mark.parametrize("kernel", ["packed", "blas", "mkl"])
def test_a_fixed_kernel_is_never_measured(measured, monkeypatch, kernel):
    monkeypatch.setattr(kernels_mod, "KERNEL", kernel)
    choice = kernels_mod.KernelChoice()
    run_passes(choice, {object(): (timed_calls(measured, "packed", 0),
                                   timed_calls(measured, "blas", 0),
                                   timed_calls(measured, "mkl", 0))}, TRIAL_PASSES + 1)
    assert set(measured) == {kernel} and not choice.chosen and not choice.trials


@pytest.mark.parametrize("value,kernel", [("blas", "blas"), ("packed", "packed"),
                                          ("mkl", "mkl"), (None, "measured"), ("", "measured"),
                                          ("fast", "measured")])
def test_the_kernel_from_the_environment(monkeypatch, capsys, value, kernel):
    if value is None:
        monkeypatch.delenv(kernels_mod.KERNEL_ENV, raising=False)
    else:
        monkeypatch.setenv(kernels_mod.KERNEL_ENV, value)
    assert kernels_mod.kernel_setting() == kernel
    assert (kernels_mod.kernel_setting_problem() is not None) == (value == "fast")
    kernels_mod.note_kernel_setting.cache_clear()
    with linear_mod.packed_weights(Linear(4, 4)), linear_mod.packed_weights(Linear(4, 4)):
        pass  # a program that decodes is told once, at its first scope
    assert capsys.readouterr().err.count("is not one of") == (value == "fast")
    kernels_mod.note_kernel_setting.cache_clear()


@needs_packing
def test_measured_products_equal_f_linear_on_every_kernel(measured, monkeypatch):
    monkeypatch.undo()  # every kernel this build has
    monkeypatch.setattr(linear_mod, "PACK_MIN_ELEMENTS", 1)
    monkeypatch.setattr(kernels_mod, "KERNEL", "measured")
    monkeypatch.setattr(kernels_mod, "TURN_WARM_SECONDS", 0.0)
    block = DecoderBlock(32, 4, 64, cross_attention=False).eval()
    h = torch.randn(2, 3, 32)
    kernels = []
    block.ffn.proj.register_forward_hook(
        lambda m, i, o: kernels.append(m.kernels.trials[(8, torch.get_num_threads())].kernel
                                       if m.kernels and m.kernels.trials else None))
    schedule = pass_kernels(kernels_mod.trial_kernels())
    with torch.inference_mode():
        ref = block(h)[0]
        for _ in range(2 * len(schedule) + 2):  # the trial, then the choice: a scope per
            with linear_mod.packed_weights(block):  # call, as generation opens them (a pass
                # that made MKL copies, each first pass of a scope on MKL, is run again once)
                assert block.ffn.fc.kernels is block.self_attn.kernels is not None
                torch.testing.assert_close(block(h)[0], ref, rtol=1e-5, atol=1e-5)
    turns = [k for k, _ in itertools.groupby(kernels[1:]) if k is not None]
    assert turns == [k for k, _ in itertools.groupby(schedule)]  # every kernel ran, in turns
    assert block.ffn.fc.kernels is None and "kernels" not in vars(block.ffn.fc)
    choice = kernels_mod._choices[block]  # the model's, kept across its scopes
    assert set(choice.chosen) == {(8, torch.get_num_threads())}  # 6 rows: to 8
    assert copy.deepcopy(choice) is not choice  # a copied model measures anew


@needs_packing
def test_small_weights_keep_blas(monkeypatch):
    monkeypatch.setattr(linear_mod, "PACK_MIN_ELEMENTS", 24 * 40 + 1)
    small, large = Linear(24, 40), Linear(24, 41)
    with linear_mod.packed_weights(nn.Sequential(small, large)):
        assert small.packed is None and large.packed is not None


@needs_packing
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 24), (8, 24), (2, 3, 24), (1, 1, 24), (0, 24),
                                   (3, 5, 24)])
@pytest.mark.parametrize("kernel", ["packed", pytest.param("mkl", marks=pytest.mark.skipif(
    not linear_mod.mkl_works(), reason="this PyTorch build has no MKL packed GEMM"))])
def test_packed_path_equals_f_linear(monkeypatch, bias, shape, kernel):
    monkeypatch.setattr(kernels_mod, "KERNEL", kernel)
    layer = Linear(24, 40, bias=bias)
    x = torch.randn(*shape)
    with torch.inference_mode():
        ref = F.linear(x, layer.weight, layer.bias)
        with linear_mod.packed_weights(layer):
            assert layer.packed is not None
            assert (layer.mkl_packed is not None) == linear_mod.mkl_works()
            y = layer(x)
            wide = torch.randn(*shape[:-1], 48)
            strided = layer(wide[..., ::2])  # a non-contiguous input
        strided_ref = F.linear(wide[..., ::2], layer.weight, layer.bias)
    assert layer.packed is None and layer.mkl_packed is None  # dropped when the scope closes
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(strided, strided_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not linear_mod.mkl_works(), reason="this PyTorch build has no MKL packed GEMM")
def test_mkl_copies_are_packed_for_the_rows_rounded_up_and_the_last_two_kept():
    w, b = torch.randn(40, 24), torch.randn(40)
    product = packing_mod.MKLPacked(lambda: (w, b))
    made, copies = [], []
    with torch.inference_mode():
        for n in (5, 12, 3, 16, 9, 17, 1):
            x = torch.randn(n, 24)
            torch.testing.assert_close(product(x), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
            made.append([e[0] for e in product.held])
            copies.append(product.held[0][1])
    assert made == [[8], [16, 8], [8, 16], [16, 8], [16, 8], [24, 16], [8, 24]]
    # a step's 8 rows and a prefill's 16 take turns without packing again; 24 rows then drop
    # the copy for 8, which is made anew
    assert copies[2] is copies[0] and copies[3] is copies[1] and copies[4] is copies[1]
    assert len({id(c) for c in copies}) == 4 and copies[6] is not copies[0]


@pytest.mark.skipif(not linear_mod.mkl_works(), reason="this PyTorch build has no MKL packed GEMM")
@pytest.mark.parametrize("mkl_slower", [True, False])
def test_a_trial_drops_mkl_copies_unless_it_chooses_mkl(measured, monkeypatch, mkl_slower):
    monkeypatch.setattr(kernels_mod, "trial_kernels", lambda rows=1: ("packed", "blas", "mkl"))
    product_of = packing_mod.MKLPacked.__call__

    def timed(self, x):
        time.sleep(0.004 if mkl_slower else 0.0)
        return product_of(self, x)

    monkeypatch.setattr(packing_mod.MKLPacked, "__call__", timed)
    if not mkl_slower:  # the other two slower
        for name in ("packed_linear", "F"):
            real = getattr(linear_mod, name)
            monkeypatch.setattr(linear_mod, name, SlowCalls(real, 0.004))
    layer, x = Linear(24, 40), torch.randn(3, 24)
    with torch.inference_mode(), linear_mod.packed_weights(layer):
        product = layer.mkl_packed
        passes = len(pass_kernels(("packed", "blas", "mkl")))
        for _ in range(passes // 2):  # a turn each, each pass one product here
            layer(x)
        assert [e[0] for e in product.held] == [8]  # 3 rows padded to 8
        for _ in range(passes // 2 + 2):  # the other turns (the pass that made the copy
            layer(x)  # is run again), then the choice
        chosen = kernels_mod.choice_for(layer).chosen[(4, torch.get_num_threads())]
        assert (chosen == "mkl") != mkl_slower
        assert (not product.held) == mkl_slower


@pytest.mark.skipif(not linear_mod.mkl_works(), reason="this PyTorch build has no MKL packed GEMM")
def test_release_keeps_the_copies_a_row_count_on_mkl_reads():
    w, b = torch.randn(40, 24), torch.randn(40)
    small, large = (packing_mod.MKLPacked(lambda: (w, b)) for _ in range(2))
    with torch.inference_mode():
        small(torch.randn(3, 24))  # the copy for 8 rows serves 1 to 8
        large(torch.randn(20, 24))  # for 24 rows, in the bucket of 32
        large(torch.randn(2, 24))  # and one for 8
    small.release({1})  # products of one row read the 8-row copy: kept
    large.release({1})  # nothing on MKL reads the 24-row copy: dropped, the 8-row one kept
    assert [e[0] for e in small.held] == [8] and [e[0] for e in large.held] == [8]
    small.release({32})
    assert small.held == ()


@needs_packing
def test_mkl_asked_for_where_the_build_has_none_says_so_and_uses_blas(monkeypatch, capsys):
    monkeypatch.setattr(kernels_mod, "KERNEL", "mkl")
    monkeypatch.setattr(linear_mod, "mkl_works", lambda: False)
    kernels_mod.say_no_mkl.cache_clear()
    layer, x = Linear(24, 40), torch.randn(3, 24)
    with torch.inference_mode(), linear_mod.packed_weights(layer):
        assert layer.mkl_packed is None
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    assert "no MKL packed GEMM; BLAS computes" in capsys.readouterr().err
    kernels_mod.say_no_mkl.cache_clear()


def test_compiled_code_takes_the_packed_copy_for_mkl(monkeypatch, measured):
    # MKL's copy is made at its first product, which a compiled graph cannot do
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    calls = [timed_calls(measured, k, 0) for k in ("packed", "blas", "mkl")]
    for kernel, taken in (("mkl", "packed"), ("measured", "packed"), ("blas", "blas")):
        monkeypatch.setattr(kernels_mod, "KERNEL", kernel)
        assert kernels_mod.measured_product(kernels_mod.KernelChoice(), object(),
                                           torch.zeros(1, 4), *calls) == taken
        assert kernels_mod.settled_kernel(kernels_mod.KernelChoice(), 1) == taken


class SlowCalls:
    """A module or function whose calls (and whose attributes' calls) take ``seconds`` more."""

    def __init__(self, real, seconds: float):
        self.real, self.seconds = real, seconds

    def __call__(self, *args, **kwargs):
        time.sleep(self.seconds)
        return self.real(*args, **kwargs)

    def __getattr__(self, name):
        attr = getattr(self.real, name)
        return SlowCalls(attr, self.seconds) if callable(attr) else attr


@needs_packing
def test_gradients_and_other_dtypes_keep_the_reference_path():
    layer = Linear(24, 40)
    x = torch.randn(3, 24, requires_grad=True)
    with linear_mod.packed_weights(layer):
        layer(x).sum().backward()  # grad mode: F.linear, so gradients reach the weight
        assert layer.weight.grad is not None and x.grad is not None
    double = Linear(24, 40).double()
    with linear_mod.packed_weights(double):
        assert double.packed is None  # oneDNN packs fp32 only


@needs_packing
def test_nested_scopes_keep_the_outer_copy_and_errors_still_unpack():
    layer = Linear(24, 40)
    with linear_mod.packed_weights(layer):
        outer = layer.packed
        with linear_mod.packed_weights(layer):
            assert layer.packed is outer
        assert layer.packed is outer  # the inner scope took nothing, so dropped nothing
    with pytest.raises(RuntimeError), linear_mod.packed_weights(layer):
        raise RuntimeError("boom")
    assert layer.packed is None
    # the module's attributes are as before (a torch.compile graph guards on them)
    assert "packed" not in vars(layer)


def test_without_onednn_nothing_is_packed(monkeypatch):
    monkeypatch.setattr(linear_mod, "packing_works", lambda: False)
    layer = Linear(24, 40)
    with linear_mod.packed_weights(layer):
        assert layer.packed is None


@needs_packing
@pytest.mark.parametrize("kernel", ["packed", "blas"])
@pytest.mark.parametrize("kw", [dict(), dict(bias=False), dict(n_kv_head=1),
                                dict(qk_norm=True)])
def test_stacked_qkv_equals_the_three_projections(monkeypatch, kw, kernel):
    monkeypatch.setattr(kernels_mod, "KERNEL", kernel)
    attn = MultiHeadAttention(32, 4, causal=True, **kw).eval()
    x = torch.randn(2, 5, 32)
    with torch.inference_mode():
        ref, _ = attn(x)
        with linear_mod.packed_weights(attn):
            assert attn.packed_qkv is not None
            y, _ = attn(x)
        assert attn.packed_qkv is None
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


@needs_packing
def test_each_weight_is_packed_once():
    # Self-attention reads its q, k, v from the stacked copy only, so they get none of their
    # own; cross-attention projects queries and keys from different inputs: each packs alone.
    block = DecoderBlock(32, 4, 64, cross_attention=True).eval()
    x, memory = torch.randn(2, 3, 32), torch.randn(2, 5, 32)
    with torch.inference_mode():
        ref, _, _ = block(x, memory)
        with linear_mod.packed_weights(block):
            own = block.self_attn
            assert own.packed_qkv is not None and own.out_proj.packed is not None
            assert all(p.packed is None for p in (own.q_proj, own.k_proj, own.v_proj))
            cross = block.cross_attn
            assert cross.packed_qkv is None
            assert all(p.packed is not None for p in (cross.q_proj, cross.k_proj,
                                                      cross.v_proj, cross.out_proj))
            with linear_mod.packed_weights(block):  # nested: the outer stacked copy serves
                assert own.q_proj.packed is None
            y, _, _ = block(x, memory)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    assert "packed_qkv" not in vars(own) and own.packed_qkv is None


@needs_packing
def test_packed_generation_sees_each_optimizer_step(make_gpt):
    # The pack is taken per generate call: a step of CPU's fused AdamW (which does not bump
    # the weights' version counters) in between is seen by the next call.
    model = make_gpt(scale=0.3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    prompt = torch.zeros(1, 3, dtype=torch.long)
    for _ in range(2):
        out = model.generate(prompt, 6, temperature=0)
        with torch.no_grad():  # the reference path: no cache, no packing
            ref = model.generate(prompt, 6, temperature=0, use_cache=False)
        assert torch.equal(out, ref)
        model.train()
        logits, loss = model(torch.randint(0, 13, (2, 8)), torch.randint(0, 13, (2, 8)))
        loss.backward()
        opt.step()
        opt.zero_grad()
        model.eval()
    assert all(m.packed is None for m in model.modules() if isinstance(m, Linear))


def test_only_plain_fp32_tensors_are_packable(monkeypatch):
    class Sharded(torch.Tensor):  # FSDP's DTensor parameters are a subclass like this
        pass

    w = torch.randn(40, 24)
    assert linear_mod.packable(w) == linear_mod.packing_works()
    assert not linear_mod.packable(w.as_subclass(Sharded))
    assert not linear_mod.packable(w.double())
    monkeypatch.setattr(linear_mod, "PACK_MIN_ELEMENTS", 2 * w.numel())
    assert linear_mod.packable(w, w) == linear_mod.packing_works()  # stacked: counted together
    assert not linear_mod.packable(w)


@needs_packing
@pytest.mark.parametrize("kernel", ["packed", "blas"])
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "relu2"])
def test_feedforward_with_its_activation_fused_equals_the_reference(monkeypatch, activation,
                                                                    kernel):
    monkeypatch.setattr(kernels_mod, "KERNEL", kernel)
    ffn = FeedForward(32, 64, activation).eval()
    x = torch.randn(2, 3, 32)
    with torch.inference_mode():
        ref = ffn(x)
        with linear_mod.packed_weights(ffn):
            y = ffn(x)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    fused = packing_mod.fused_activation(ffn.act)
    assert (fused is None) == (activation == "relu2")  # ReLU^2 has no oneDNN post-op


@needs_packing
def test_generate_packs_for_its_run_and_a_waiting_stream_holds_nothing(make_gpt):
    """GPT.generate holds the packed copies for its whole run; a stream between two tokens
    holds none, so a change of the weights while it waits is seen by its next token."""
    model = make_gpt(scale=0.3)
    seen = []
    model.lm_head.register_forward_hook(lambda m, i, o: seen.append(m.packed is not None))
    prompt = torch.zeros(1, 3, dtype=torch.long)
    model.generate(prompt, 4, temperature=0)
    assert seen == [True] * 4
    stream = model.stream(prompt, 2, temperature=0)
    first = next(stream)
    assert seen[-1] is False and model.lm_head.packed is None
    proj = model.decoder.layers[-1].ffn.proj  # changes the next logits, not the cached keys
    with torch.no_grad():
        before = model(torch.cat([prompt, first], dim=1))[0][0, -1].argmax()
        proj.weight.mul_(-1.0)
        after = model(torch.cat([prompt, first], dim=1))[0][0, -1].argmax()
    assert before != after  # so a stale copy would show
    assert next(stream).item() == after.item()


@pytest.mark.parametrize("shape", [(1, 1536), (8, 1536), (3, 2, 10), (5, 7), (1, 40000), (2,),
                                   "strided"])
def test_own_gelu_is_x_times_phi_x(shape):
    # x Φ(x) in fp64, Φ from erf: the same values in the same places, every path of own_gelu
    # (a transposed view; F.gelu for odd, tiny, large and non-contiguous tensors)
    x = torch.randn(40, 8).t() * 3 if shape == "strided" else torch.randn(shape) * 3
    phi = 0.5 * (1 + torch.erf(x.double() / 2 ** 0.5))
    y = packing_mod.own_gelu(x)
    assert y.shape == x.shape and y.stride() == x.stride()  # in x's layout
    torch.testing.assert_close(y.double(), x.double() * phi, rtol=1e-6, atol=4e-6)


def test_own_gelu_takes_pytorchs_own_kernel_for_a_step():
    # the step's sizes go to PyTorch's kernel: what F.gelu computes with oneDNN turned off
    x = torch.randn(8, 1536)
    with torch.backends.mkldnn.flags(enabled=False):
        own_kernel = F.gelu(x)
    assert torch.equal(packing_mod.own_gelu(x), own_kernel)


@pytest.mark.parametrize("shape", [(8, 1536), (8, 192, 1536), "strided"])
def test_product_gelu_equals_gelu_and_reuses_a_large_output(shape):
    # a step's sizes by own_gelu (a new tensor); a prefill's in place, the same values
    x = torch.randn(1536, 8 * 192).t() if shape == "strided" else torch.randn(shape)
    expected = packing_mod.own_gelu(x)
    y = packing_mod.product_gelu(x)
    assert torch.equal(y, expected)
    in_place = x.numel() > packing_mod.OWN_GELU_MAX and x.is_contiguous()
    assert (y.data_ptr() == x.data_ptr()) == in_place and in_place == (shape == (8, 192, 1536))


@needs_packing
@pytest.mark.parametrize("kernel", ["blas", pytest.param("mkl", marks=pytest.mark.skipif(
    not linear_mod.mkl_works(), reason="this PyTorch build has no MKL packed GEMM"))])
def test_products_that_do_not_apply_the_gelu_are_followed_by_own_gelu(monkeypatch, kernel):
    # the modules' path inside the scope (a prefill, a kernel trial): BLAS's and MKL's
    # products, which cannot apply an activation, take own_gelu after them
    monkeypatch.setattr(linear_mod, "PACK_MIN_ELEMENTS", 1)
    monkeypatch.setattr(kernels_mod, "KERNEL", kernel)
    calls = []
    monkeypatch.setattr(packing_mod, "own_gelu", lambda x: calls.append(x.shape) or F.gelu(x))
    ffn = FeedForward(32, 64, "gelu").eval()
    with torch.inference_mode(), linear_mod.packed_weights(ffn):
        ffn(torch.randn(2, 3, 32))
    assert calls == [(2, 3, 64)]


@needs_packing
@pytest.mark.parametrize("kernel", ["blas", pytest.param("mkl", marks=pytest.mark.skipif(
    not linear_mod.mkl_works(), reason="this PyTorch build has no MKL packed GEMM"))])
@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_a_prefills_activation_in_place_changes_nothing_else(monkeypatch, kernel, activation):
    # 8 x 40 rows of a 1,536-wide FFN (more values than a step's): the activation runs in
    # place on the product's output; the input and the result are as without the scope
    monkeypatch.setattr(kernels_mod, "KERNEL", kernel)
    torch.manual_seed(0)
    ffn = FeedForward(384, 1536, activation).eval()
    x = torch.randn(8, 40, 384)
    x_before = x.clone()
    with torch.inference_mode():
        expected = ffn(x)
        with linear_mod.packed_weights(ffn):
            y = ffn(x)
    assert torch.equal(x, x_before)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)


def test_unfused_activation():
    assert packing_mod.unfused_activation(nn.GELU()) is packing_mod.product_gelu
    assert packing_mod.unfused_activation(nn.ReLU()) is F.relu_
    tanh = nn.GELU(approximate="tanh")  # PyTorch's own kernel already
    assert packing_mod.unfused_activation(tanh) is tanh
