"""LoRA through peft: only the adapters train (r * (in + out) each), the merged weights give
the unmerged model's logits and load without peft, PEFT reads the adapter it was given,
resume is exact, and bad settings are one line and exit 2."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from minitransformer import cli, load_checkpoint
from minitransformer.config import EncoderConfig
from minitransformer.errors import UserError
from minitransformer.io import load_tensors
from minitransformer.models import GPT
from minitransformer.models.encoder import EncoderModel
from minitransformer.training import checkpoint as ckpt
from minitransformer.training.lora import LORA_STATE, Lora, LoraConfig

peft = pytest.importorskip("peft")

TINY = ["--preset", "debug", "--n_embd", "32", "--batch_size", "8", "--eval_iters", "2",
        "--sample_tokens", "0", "--quiet"]


def _train(data, out, *flags: str) -> None:
    assert cli.main(["train", "--data", str(data), "--out", str(out), *TINY, *flags]) == 0


def _log(run) -> list[dict]:
    with open(run / "log.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _randomise_adapters(model) -> None:
    """B starts at zero (merged = base); give A and B values so that merging matters."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.3)


# ---- the adapters alone ----------------------------------------------------------------

@pytest.mark.parametrize("targets, per_layer", [
    # n_embd 16, d_ff 64, r 4: q, v are 16 -> 16; fc 16 -> 64; proj 64 -> 16
    ("q_proj,v_proj", 4 * (16 + 16) * 2),
    ("q_proj,k_proj,v_proj,out_proj", 4 * (16 + 16) * 4),
    ("fc,proj", 4 * (16 + 64) * 2),
    ("up_proj,down_proj,o_proj", 4 * (16 + 64) * 2 + 4 * (16 + 16)),  # Llama's names: ours
])
def test_trainable_parameters_are_the_adapters_alone(make_gpt, targets, per_layer):
    model = make_gpt()
    lora = Lora(model, LoraConfig(lora_rank=4, lora_targets=targets))
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert sum(p.numel() for p in trainable.values()) == 2 * per_layer  # two layers
    assert lora.trainable() == lora.expected_trainable() == 2 * per_layer
    assert all(".lora_A." in n or ".lora_B." in n for n in trainable)


def test_merged_weights_give_the_unmerged_logits_and_leave_the_model_wrapped(make_gpt):
    model = make_gpt(scale=0.2)
    lora = Lora(model, LoraConfig(lora_rank=3, lora_alpha=6, lora_targets="q_proj,v_proj,fc"))
    _randomise_adapters(model)
    idx = torch.randint(0, 13, (2, 16))
    with torch.no_grad():
        unmerged, _ = model(idx)
        merged = lora.merged_state()
        plain = GPT(model.config).eval()  # a fresh model loads the saved tensors
        load_tensors(plain, ckpt.model_tensors(merged), "merged")
        got, _ = plain(idx)
        base = GPT(model.config).eval()  # the same model without its adapters
        load_tensors(base, {k.replace(".base_layer", ""): v for k, v in model.state_dict().items()
                            if "lora_" not in k}, "base")
        without, _ = base(idx)
    torch.testing.assert_close(got, unmerged, atol=1e-5, rtol=0)
    assert (without - unmerged).abs().max() > 1e-2  # the adapters change the logits
    assert set(ckpt.model_tensors(merged)) == set(ckpt.model_tensors(base))
    assert any(".lora_A." in k for k in model.state_dict())  # the live model keeps them
    saved = {k: v.clone() for k, v in ckpt.model_tensors(merged).items()}
    folded = ckpt.model_tensors(lora.merge_in_place())  # at the end of training: in place
    assert saved.keys() == folded.keys()
    assert all(torch.equal(saved[k], folded[k]) for k in saved)


def test_a_tied_head_or_a_layer_that_is_not_linear_cannot_be_a_target(make_gpt):
    with pytest.raises(UserError, match="tied"):
        Lora(make_gpt(), LoraConfig(lora_rank=2, lora_targets="lm_head"))
    with pytest.raises(UserError, match="not a linear layer"):
        Lora(make_gpt(), LoraConfig(lora_rank=2, lora_targets="self_attn"))
    encoder = EncoderModel(EncoderConfig(vocab_size=13, block_size=16, n_layer=1, n_head=2,
                                         n_embd=16))
    with pytest.raises(UserError, match="tied"):  # the masked-LM head's output matrix
        Lora(encoder, LoraConfig(lora_rank=2, lora_targets="decoder"))
    untied = make_gpt(tie_weights=False)  # an untied head is an ordinary linear layer
    lora = Lora(untied, LoraConfig(lora_rank=2, lora_targets="lm_head"))
    assert lora.trainable() == 2 * (16 + 13)


# ---- a LoRA run -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_text):
    root = tmp_path_factory.mktemp("lora")
    data = root / "tiny.txt"
    data.write_text(tiny_text, encoding="utf-8")
    out = root / "run"
    _train(data, out, "--max_iters", "20", "--eval_interval", "10", "--lora-rank", "4",
           "--lora-alpha", "8", "--lora-targets", "q_proj,v_proj", "--lora-save-adapter")
    return data, out


def test_a_run_trains_the_adapters_only(lora_run):
    _, out = lora_run
    first, last = (load_file(out / "checkpoints" / f"step_{s:07d}" / "model.safetensors")
                   for s in (10, 20))
    targets = [k for k in first if k.endswith(("q_proj.weight", "v_proj.weight"))]
    assert len(targets) == 2 * 2  # two layers, two targets
    for name in first:  # frozen weights (biases too) do not move; merged targets do
        assert torch.equal(first[name], last[name]) == (name not in targets), name
    state = load_file(out / "checkpoints" / "step_0000020" / "trainer_state.safetensors")
    moments = [t for k, t in state.items() if k.endswith(".exp_avg")]
    assert sum(t.numel() for t in moments) == 4 * (32 + 32) * 2 * 2  # r (in + out), 4 targets
    meta = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert meta["lora"]["lora_rank"] == 4 and meta["lora"]["lora_targets"] == "q_proj,v_proj"
    newest, _ = load_checkpoint(out, which="last")  # a checkpoint folder loads plain too
    assert all(torch.equal(t, last[k]) for k, t in ckpt.model_tensors(newest).items())


def test_the_run_folder_holds_plain_weights_equal_to_peft_with_the_adapter(lora_run):
    """The merged best model against PeftModel.from_pretrained(base, run folder): the base
    rebuilt from the checkpoint's frozen weights, the adapter read by peft itself."""
    _, out = lora_run
    merged, _ = load_checkpoint(out)
    meta = json.loads((out / "config.json").read_text(encoding="utf-8"))
    folder = out / "checkpoints" / f"step_{meta['step']:07d}"
    own = load_file(folder / LORA_STATE)
    base_tensors = {k: v for k, v in load_file(out / "model.safetensors").items()
                    if not (".q_proj." in k or ".v_proj." in k)}
    base_tensors.update({k.replace(".base_layer", ""): v for k, v in own.items()
                         if ".base_layer." in k})
    base = GPT(merged.config)
    load_tensors(base, base_tensors, "base")
    idx = torch.randint(0, merged.config.vocab_size, (2, merged.config.block_size))
    with torch.no_grad():
        without, _ = base.eval()(idx)
        reference = peft.PeftModel.from_pretrained(base, str(out)).eval()
        expected, _ = reference(idx)
        got, _ = merged(idx)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert (without - expected).abs().max() > 1e-4  # the adapter is not a no-op
    assert not any("lora" in k or "base_layer" in k for k in load_file(out / "model.safetensors"))


BLOCK_PEFT = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "peft" or name.startswith("peft."):
            raise ImportError("peft is blocked")
sys.meta_path.insert(0, Block())
from minitransformer import cli, load_checkpoint
model, tokenizer = load_checkpoint(sys.argv[1])
code = cli.main(["sample", sys.argv[1], "--prompt", "the ", "--max_new_tokens", "8",
                 "--seed", "1"])
assert "peft" not in sys.modules
sys.exit(code)
"""


def test_the_merged_run_loads_and_samples_without_peft(lora_run):
    _, out = lora_run
    done = subprocess.run([sys.executable, "-c", BLOCK_PEFT, str(out)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("the ")
    check = subprocess.run([sys.executable, "-c", BLOCK_PEFT.split("from minitransformer")[0]
                            + "import peft"], capture_output=True, text=True)
    assert check.returncode != 0  # the block does block


def test_resume_restores_the_adapters_and_their_optimizer_state(lora_run, tmp_path):
    """20 steps, then 20 more from the checkpoint: the same losses and the same files as 40
    steps in one go (with adapter dropout, so that the random stream matters too)."""
    data, _ = lora_run
    flags = ("--eval_interval", "20", "--lora_rank", "4", "--lora_dropout", "0.1")
    _train(data, tmp_path / "full", "--max_iters", "40", *flags)
    _train(data, tmp_path / "part", "--max_iters", "20", *flags)
    assert cli.main(["train", "--out", str(tmp_path / "part"), "--resume", "--max_iters", "40",
                     "--quiet"]) == 0

    def curve(run):
        return [(r["step"], r["train_loss"], r["val_loss"], r["grad_norm"]) for r in _log(run)]

    assert curve(tmp_path / "part") == curve(tmp_path / "full")
    for name in ("model.safetensors", LORA_STATE, "trainer_state.safetensors"):
        a, b = (load_file(tmp_path / run / "checkpoints" / "step_0000040" / name)
                for run in ("full", "part"))
        assert a.keys() == b.keys(), name
        for key in a:
            if not key.startswith("rng."):
                assert torch.equal(a[key], b[key]), (name, key)


# ---- bad settings ----------------------------------------------------------------------

@pytest.mark.parametrize("flags, says", [
    (["--lora_alpha", "4"], "need(s) --lora_rank"),
    (["--lora-targets", "q_proj", "--lora-dropout", "0.1"], "need(s) --lora_rank"),
    (["--lora_rank", "0"], "--lora_rank must be a positive rank"),
    (["--lora_rank", "-2"], "--lora_rank must be a positive rank"),
    (["--lora_rank", "2", "--lora_targets", "q_prj"], "matches no module"),
    (["--lora_rank", "2", "--lora_targets", "lm_head"], "tied"),
    (["--lora_rank", "2", "--lora_targets", "decoder"], "not a linear layer"),
    (["--lora_rank", "2", "--lora_dropout", "1.5"], "--lora_dropout"),
])
def test_bad_lora_settings_are_one_line_and_exit_2(lora_run, tmp_path, capsys, flags, says):
    data, _ = lora_run
    code = cli.main(["train", "--data", str(data), "--out", str(tmp_path / "o"), *TINY,
                     "--max_iters", "2", *flags])
    err = capsys.readouterr().err
    assert code == 2
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_resume_keeps_the_lora_settings(lora_run, tmp_path, capsys):
    data, out = lora_run
    for steps in ("30", "20"):  # 20: nothing left to train, the flag still does not apply
        code = cli.main(["train", "--out", str(out), "--resume", "--max_iters", steps,
                         "--quiet", "--lora_rank", "8"])
        err = capsys.readouterr().err
        assert code == 2 and "--lora_rank differs" in err, (steps, err)
        assert len(err.strip().splitlines()) == 1
    plain = tmp_path / "plain"
    _train(data, plain, "--max_iters", "2", "--eval_interval", "2")
    code = cli.main(["train", "--out", str(plain), "--resume", "--max_iters", "4", "--quiet",
                     "--lora_rank", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "without LoRA" in err and len(err.strip().splitlines()) == 1


def test_lora_on_a_model_started_from_another_run(lora_run, tmp_path, capsys):
    """--init_from a plain run: the frozen weights stay the source's to the bit, and PEFT's own
    PeftModel over the source model with the saved adapter gives the merged run's logits."""
    data, _ = lora_run
    source, tuned = tmp_path / "source", tmp_path / "tuned"
    _train(data, source, "--max_iters", "10", "--eval_interval", "10")
    _train(data, tuned, "--init_from", str(source), "--max_iters", "10", "--eval_interval", "5",
           "--lora_rank", "2", "--lora_targets", "out_proj,fc", "--lora_save_adapter", "true")
    assert "frozen random weights" not in capsys.readouterr().out
    _train(data, tmp_path / "scratch", "--max_iters", "1", "--lora_rank", "2")
    assert "note: LoRA without --init_from" in capsys.readouterr().out
    before, after = (load_file(run / "model.safetensors") for run in (source, tuned))
    assert before.keys() == after.keys()
    for name in before:
        adapted = name.endswith(("out_proj.weight", "fc.weight"))
        assert torch.equal(before[name], after[name]) != adapted, name
    base, _ = load_checkpoint(source)
    merged, _ = load_checkpoint(tuned)
    idx = torch.randint(0, base.config.vocab_size, (2, base.config.block_size))
    with torch.no_grad():
        expected, _ = peft.PeftModel.from_pretrained(base, str(tuned)).eval()(idx)
        got, _ = merged(idx)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def _pairs(path, tiny_text) -> str:
    """Sentence pairs for a seq2seq run: each line and its reverse, tab-separated."""
    lines = [line for line in tiny_text.splitlines() if line]
    path.write_text("".join(f"{s}\t{s[::-1]}\n" for s in lines * 5), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("family", ["encoder", "seq2seq"])
def test_lora_runs_for_the_other_families_load_plain_and_resume(family, tiny_text, tmp_path,
                                                                capsys):
    data = tmp_path / "tiny.txt"
    data.write_text(tiny_text, encoding="utf-8")
    if family == "seq2seq":
        data = _pairs(tmp_path / "pairs.tsv", tiny_text)
    extra = ["--vocab_size", "300", "--batch_tokens", "600"] if family == "seq2seq" else []
    out = tmp_path / "run"
    flags = ["--model", family, "--preset", "debug", *extra, "--eval_iters", "2",
             "--sample_tokens", "0", "--eval_interval", "2", "--lora_rank", "2"]
    assert cli.main(["train", "--data", str(data), "--out", str(out), *flags, "--max_iters",
                     "2"]) == 0
    printed = capsys.readouterr().out
    assert "LoRA rank 2" in printed and "parameters train" in printed
    assert " linear layers (q_proj,v_proj)" in printed  # modules adapted, not blocks
    own = load_file(out / "checkpoints" / "step_0000002" / LORA_STATE)
    assert any(".lora_A." in k for k in own) and any(".base_layer." in k for k in own)
    assert not any("lora" in k for k in load_file(out / "model.safetensors"))
    assert cli.main(["evaluate", str(out)]) == 0  # plain weights, as any run's
    assert cli.main(["train", "--out", str(out), "--resume", "--max_iters", "4",
                     "--quiet"]) == 0
    assert [p.name for p in ckpt.list_checkpoints(out)][-1] == "step_0000004"


def test_two_data_parallel_processes_train_the_adapters_as_one_does(lora_run, tmp_path):
    """torchrun, 2 CPU processes (DDP over the adapters alone) against one process."""
    import os
    import socket

    data, _ = lora_run
    common = [*TINY, "--data", str(data), "--max_iters", "6", "--eval_interval", "3",
              "--log_interval", "1", "--n_layer", "1", "--block_size", "16", "--dtype",
              "float32", "--lora_rank", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    two = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "minitransformer"]
    done = subprocess.run([*two, "train", *common, "--out", str(tmp_path / "two")],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert cli.main(["train", *common, "--out", str(tmp_path / "one")]) == 0  # in this process
    one, two = ([float(r["train_loss"]) for r in _log(tmp_path / run) if r["train_loss"]]
                for run in ("one", "two"))
    # log.csv rounds to 5 decimals: losses equal to 1e-6 can print one last digit apart
    assert len(one) == 6 and one == pytest.approx(two, abs=1.5e-5)
    a, b = (load_file(tmp_path / run / "model.safetensors") for run in ("one", "two"))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_a_layer_named_by_its_index_is_listed_with_its_container():
    """BERT's head holds its dense layer as mlm_head.transform.0: the names listed for a
    target that matches nothing gave "0" (which names every first layer of a list); they give
    "transform.0", itself a target that finds that layer alone."""
    from minitransformer.training.lora import find_targets

    torch.manual_seed(0)
    model = EncoderModel(EncoderConfig(vocab_size=30, block_size=8, n_layer=1, n_head=2,
                                       n_embd=16, mask_id=29, mlm_head="bert"))
    with pytest.raises(UserError) as e:
        find_targets(model, LoraConfig(lora_rank=2, lora_targets="nope"))
    names = str(e.value).split("named ")[1].split(", ")
    assert "transform.0" in names and "0" not in names, names
    assert list(find_targets(model, LoraConfig(lora_rank=2, lora_targets="transform.0"))) == \
        ["mlm_head.transform.0"]
