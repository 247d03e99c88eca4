"""compare: name-seeded initial values, the same batches for every variant, the results files,
length extrapolation, and the --vary parser."""

from __future__ import annotations

import csv
import hashlib
import json
import math

import pytest
import torch

from minitransformer import cli, families
from minitransformer.config import GPTConfig, Seq2SeqConfig
from minitransformer.experiments.seeding import reseed_parameters
from minitransformer.families.gpt import GPTFamily
from minitransformer.models import GPT, Seq2SeqTransformer

POSITIONS = ["sinusoidal", "learned", "rope", "alibi"]


def _reference_seed(seed: int, name: str) -> int:
    """The documented seed: first 8 bytes of sha256("seed:name"), little-endian, 63 bits."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def _gpt(pos: str, norm: str = "pre", init: str = "gpt2") -> GPT:
    return GPT(GPTConfig(vocab_size=23, block_size=16, n_layer=2, n_head=2, n_embd=16,
                         pos_encoding=pos, norm_position=norm, init=init))


# ---- initial values -----------------------------------------------------------------------

def test_without_reseeding_shared_parameters_differ():
    """Why reseeding is needed: a learned position table shifts the global random stream."""
    torch.manual_seed(0)
    learned = _gpt("learned").state_dict()
    torch.manual_seed(0)
    rope = _gpt("rope").state_dict()
    name = "decoder.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(learned[name], rope[name])


def test_shared_parameters_start_equal_only_varied_parts_differ():
    models = {}
    for i, (pos, norm) in enumerate((p, n) for p in POSITIONS for n in ("pre", "post")):
        torch.manual_seed(i)  # a different global stream for each: reseeding must not care
        model = _gpt(pos, norm)
        reseed_parameters(model, seed=7, scheme="gpt2", n_layer=2)
        models[pos, norm] = model.state_dict()
    names = {key: set(sd) for key, sd in models.items()}
    shared = set.intersection(*names.values())
    for key, sd in models.items():
        for name in shared:
            assert torch.equal(sd[name], models["sinusoidal", "pre"][name]), (key, name)
        extra = names[key] - shared  # only the varied parts
        assert extra == ({"pos_emb.weight"} if key[0] == "learned" else set()) | \
            ({"decoder.final_norm.weight", "decoder.final_norm.bias"} if key[1] == "pre"
             else set())
    sd = models["learned", "pre"]
    # the values are N(0, std) drawn from the name's own generator (independent recomputation)
    for name, std in [("decoder.layers.1.self_attn.q_proj.weight", 0.02),
                      ("decoder.layers.0.self_attn.out_proj.weight", 0.02 / math.sqrt(4)),
                      ("decoder.layers.1.ffn.proj.weight", 0.02 / math.sqrt(4)),
                      ("tok_emb.weight", 0.02), ("pos_emb.weight", 0.02)]:
        gen = torch.Generator().manual_seed(_reference_seed(7, name))
        expected = torch.randn(sd[name].shape, generator=gen) * std
        torch.testing.assert_close(sd[name], expected, rtol=0, atol=1e-7)
    assert torch.equal(sd["lm_head.weight"], sd["tok_emb.weight"])  # still tied
    assert not sd["decoder.layers.0.self_attn.q_proj.bias"].any()
    assert torch.equal(sd["decoder.layers.0.res_self.norm.weight"], torch.ones(16))
    # another seed gives other values
    other = _gpt("learned")
    reseed_parameters(other, seed=8, scheme="gpt2", n_layer=2)
    assert not torch.equal(other.state_dict()["tok_emb.weight"], sd["tok_emb.weight"])


def test_xavier_scheme_matches_nn_init_bounds():
    model = _gpt("rope", init="xavier")
    reseed_parameters(model, seed=1, scheme="xavier", n_layer=2)
    w = model.decoder.layers[0].ffn.fc.weight  # (64, 16): bound sqrt(6 / (16 + 64))
    bound = math.sqrt(6 / (16 + 64))
    assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound


def _scaled(kind: str, init: str):
    if kind == "seq2seq":  # the defaults: scale_embeddings=True, init xavier
        return Seq2SeqTransformer(Seq2SeqConfig(vocab_size=600, block_size=16, n_layer=2,
                                                n_head=2, n_embd=32, init=init))
    return GPT(GPTConfig(vocab_size=600, block_size=16, n_layer=2, n_head=2, n_embd=32,
                         init=init, scale_embeddings=True))


@pytest.mark.parametrize("kind, init, depth", [("seq2seq", "xavier", 4), ("seq2seq", "gpt2", 4),
                                               ("gpt", "gpt2", 2), ("gpt", "xavier", 2)])
def test_reseeding_draws_what_the_models_own_init_draws(kind, init, depth):
    """compare must start each variant where train does: with scale_embeddings the token
    embedding is N(0, d^-0.5) (so E * sqrt(d) has unit variance), every other parameter
    follows the scheme; reseeded stds match a freshly built model's, parameter by parameter."""
    torch.manual_seed(0)
    fresh = dict(_scaled(kind, init).named_parameters())
    torch.manual_seed(1)
    model = _scaled(kind, init)
    reseed_parameters(model, seed=3, scheme=init, n_layer=depth)
    reseeded = dict(model.named_parameters())
    assert reseeded.keys() == fresh.keys()
    emb = reseeded["tok_emb.weight"]
    assert emb.std().item() == pytest.approx(32 ** -0.5, rel=0.1)
    for name, want in fresh.items():
        got = reseeded[name]
        if want.std() == 0 or want.numel() == 1:  # biases 0, LayerNorm weights 1
            assert torch.equal(got, want), name
        else:
            assert got.std().item() == pytest.approx(want.std().item(), rel=0.1), name
            assert got.mean().abs().item() < 0.1 * want.std().item() + 1e-3, name
    assert torch.equal(model.lm_head.weight, model.tok_emb.weight)  # still tied


# ---- the whole command --------------------------------------------------------------------

class RecordingGPT(GPTFamily):
    """GPTFamily that records each variant's training batches and its weights at step 0."""

    batches: dict = {}
    initial: dict = {}

    def build(self, prepared, fields, seed=0):
        built = super().build(prepared, fields, seed)
        key = (fields["pos_encoding"], fields.get("norm_position", "pre"))
        seen = self.batches.setdefault(key, [])
        model, task_batch = built.model, built.task.batch

        def batch(split, n, gen):
            b = task_batch(split, n, gen)
            if split == "train":
                if not seen:  # the weights training starts from
                    self.initial[key] = {k: v.clone() for k, v in model.state_dict().items()}
                seen.append(b[0].clone())
            return b

        built.task.batch = batch
        return built


def test_compare_same_batches_same_start_plot_and_tables(tmp_path, monkeypatch, tiny_corpus,
                                                        capsys):
    RecordingGPT.batches, RecordingGPT.initial = {}, {}
    monkeypatch.setitem(families.FAMILIES, "gpt", RecordingGPT())
    out = tmp_path / "cmp"
    code = cli.main(["compare", "--data", str(tiny_corpus), "--out", str(out),
                     "--vary", "pos_encoding=sinusoidal,learned,rope,alibi",
                     "--preset", "debug", "--n_embd", "32", "--block_size", "16",
                     "--max-iters", "6", "--eval_interval", "3", "--eval_iters", "2",
                     "--sample_tokens", "0", "--eval-lengths", "8,16,64", "--quiet"])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert "[1/4] pos_encoding=sinusoidal: " in said.out and " parameters, 6 steps" in said.out
    keys = [(p, "pre") for p in POSITIONS]
    # the same six batches, in the same order, for every variant
    assert all(len(RecordingGPT.batches[k]) == 6 for k in keys)
    for k in keys[1:]:
        for a, b in zip(RecordingGPT.batches[keys[0]], RecordingGPT.batches[k], strict=True):
            assert torch.equal(a, b)
    # the same starting values for every shared parameter; the learned table only in one
    start = RecordingGPT.initial
    shared = set.intersection(*(set(start[k]) for k in keys))
    assert "decoder.layers.1.ffn.fc.weight" in shared
    for k in keys[1:]:
        for name in shared:
            assert torch.equal(start[k][name], start[keys[0]][name]), (k, name)
    assert set(start["learned", "pre"]) - shared == {"pos_emb.weight"}

    # one run folder per variant, written by the trainer; the figure and the tables
    for p in POSITIONS:
        assert (out / p / "model.safetensors").exists() and (out / p / "log.csv").exists()
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(out / "results.csv", newline="", encoding="utf-8") as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    assert list(rows) == POSITIONS
    for p, r in rows.items():
        log = (out / p / "log.csv").read_text(encoding="utf-8").splitlines()
        log_vals = [float(x["val_loss"]) for x in csv.DictReader(log) if x["val_loss"]]
        assert float(r["final_val_loss"]) == pytest.approx(log_vals[-1], abs=1e-4)
        assert float(r["tokens_per_s"]) > 0 and int(r["steps"]) == 6
        meta = json.loads((out / p / "config.json").read_text(encoding="utf-8"))
        assert int(r["parameters"]) == GPT(GPTConfig(**meta["model"])).num_params()
        # within the training context every variant is evaluated; beyond it, not learned
        assert float(r["val_loss_at_8"]) > 0 and float(r["val_loss_at_16"]) > 0
    assert rows["learned"]["val_loss_at_64"] == "cannot extrapolate"
    for p in ("sinusoidal", "rope", "alibi"):
        assert math.isfinite(float(rows[p]["val_loss_at_64"]))
    table = (out / "results.md").read_text(encoding="utf-8")
    assert "| pos_encoding=rope |" in table and "cannot extrapolate" in table
    assert "val loss @64" in table.splitlines()[0]


def test_loss_at_length_equals_direct_cross_entropy():
    """One window of length L: the family's loss is the model's mean next-token loss on it."""
    fam = GPTFamily()
    ids = torch.arange(100) % 13
    prepared = families.Prepared("x", "utf-8", None, {}, ids, ids)
    model = _gpt("alibi").eval()
    got = fam.loss_at_length(model, prepared, 40, "cpu", n_tokens=1)  # 4 windows of 40
    gen = torch.Generator().manual_seed(0)
    starts = torch.randint(len(ids) - 40, (4,), generator=gen)
    logits = model(torch.stack([ids[s:s + 40] for s in starts]))[0]  # (4, 40, V)
    targets = torch.stack([ids[s + 1:s + 41] for s in starts])
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 23), targets.reshape(-1))
    assert got == pytest.approx(expected.item(), rel=1e-5)
    with pytest.raises(families.CannotEvaluate, match="cannot extrapolate"):
        fam.loss_at_length(_gpt("learned"), prepared, 40, "cpu")
    with pytest.raises(families.CannotEvaluate, match="too short"):
        fam.loss_at_length(model, prepared, 100, "cpu")


@pytest.mark.parametrize("vary, message", [
    (["pos_encodin=rope,alibi"], "did you mean pos_encoding"),
    (["pos_encoding=rope"], "single variant"),
    (["pos_encoding=rope,spiral"], "not one of"),
    (["n_layer=2,two"], "cannot read 'two'"),
    (["pos_encoding"], "FIELD=a,b"),
    (["n_embd=63,64"], "divisible"),  # found before the corpus is read
    (["vocab_size=300,500"], "a char tokenizer has one id per character"),
    (["n_layer=1,2", "--vocab_size=500"], "a char tokenizer has one id per character"),
    (["tokenizer=char,bpe-chars"], "every variant reads one corpus, prepared once"),
    (["lr=0.01,0.001", "--lr_schedule=noam"], "--learning_rate would change nothing"),
    (["lr_schedule=cosine,noam", "--min_lr=0"], "--min_lr would change nothing"),
    # before the first variant is trained
    (["mlm_head=bert,none", "--model=encoder"], "masked-LM training needs an output head"),
])
def test_bad_vary_is_a_user_error(tmp_path, capsys, vary, message):
    args = ["compare", "--out", str(tmp_path / "c"), "--max-iters", "1"]
    for v in vary:
        args += [v] if v.startswith("--") else ["--vary", v]  # a flag, or what to vary
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "c").exists()


def test_vary_takes_the_flag_aliases(tmp_path, capsys):
    # --lr names learning_rate in --vary too: set beside it, the clash names the setting
    assert cli.main(["compare", "--out", str(tmp_path / "c"), "--vary", "lr=0.01,0.001",
                     "--learning_rate", "0.1", "--max-iters", "1"]) == 2
    assert "learning_rate is both varied and set" in capsys.readouterr().err


def test_compare_plugs_in_the_encoder_decoder(tmp_path, capsys):
    """The seq2seq family: same command, its own task and model. --eval_lengths, a GPT's
    next-token loss on longer windows, is refused for it and for the encoder up front."""
    words = ["the", "cat", "dog", "sees", "a", "house", "red", "big", "runs", "home"]
    spanish = ["el", "gato", "perro", "ve", "una", "casa", "roja", "grande", "corre", "hogar"]
    lines = ["en\tes"]
    for i in range(80):
        idx = [(i * k + k) % len(words) for k in (1, 3, 7)]
        lines.append(" ".join(words[j] for j in idx) + ".\t" + " ".join(spanish[j] for j in idx)
                     + ".")
    (tmp_path / "pairs.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "cmp"
    args = ["compare", "--model", "seq2seq", "--data", str(tmp_path / "pairs.tsv"),
            "--out", str(out), "--vary", "norm_position=pre,post", "--preset", "debug",
            "--vocab_size", "300", "--n_embd", "32", "--max-iters", "2",
            "--eval_interval", "2", "--eval_iters", "1", "--sample_tokens", "0", "--quiet"]
    for model in ("seq2seq", "encoder"):
        asked = [model if a == "seq2seq" else a for a in args]
        assert cli.main(asked + ["--eval-lengths", "64"]) == 2
        assert "--eval_lengths scores next-token loss" in capsys.readouterr().err
    assert not out.exists()
    code = cli.main(args)
    assert code == 0, capsys.readouterr().err
    for name in ("pre", "post"):
        meta = json.loads((out / name / "config.json").read_text(encoding="utf-8"))
        assert meta["family"] == "seq2seq" and meta["model"]["norm_position"] == name
        header = (out / name / "log.csv").read_text(encoding="utf-8").splitlines()[0]
        assert "enc_attn_entropy_0" in header and "cross_attn_entropy_1" in header
    table = (out / "results.md").read_text(encoding="utf-8")
    assert "| norm_position=post |" in table


def test_compare_under_torchrun_is_refused_up_front(tmp_path, capsys, monkeypatch):
    """Its variants train one after another, each setting up and tearing down the process
    group, which torchrun's ranks cannot follow: refused before anything is read."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert cli.main(["compare", "--out", str(tmp_path / "c"), "--vary", "n_layer=1,2"]) == 2
    assert "run it without torchrun" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
