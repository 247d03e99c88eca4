"""The encoder-decoder: the toy task, the loss, the schedule, attention maps, padding, cache."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from minitransformer import load_checkpoint
from minitransformer.config import Seq2SeqConfig
from minitransformer.errors import ConfigError
from minitransformer.families import FAMILIES
from minitransformer.models import Seq2SeqTransformer
from minitransformer.models.decoding import beam_search, greedy_decode, pad_batch
from minitransformer.tokenizers import BPETokenizer
from minitransformer.toy import exact_match, toy_batch, train_toy
from minitransformer.training import checkpoint as ckpt
from minitransformer.training.schedule import noam_lr

PAD, BOS, EOS = 0, 1, 2


def make_model(scale: float | None = 0.3, **overrides) -> Seq2SeqTransformer:
    """A tiny model; ``scale`` redraws the weights ~ N(0, scale) so outputs vary by input."""
    fields = dict(vocab_size=17, block_size=64, n_layer=2, n_head=2, n_embd=16, d_ff=32,
                  dropout=0.0)
    fields.update(overrides)
    model = Seq2SeqTransformer(Seq2SeqConfig(**fields))
    if scale is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" not in name:
                    p.normal_(0.0, scale)
    return model.eval()


def random_sources(n: int, vocab: int = 17, lo: int = 2, hi: int = 9, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(3, vocab, (n_,), generator=g).tolist() + [EOS] for n_ in lengths]


def test_toy_reverse_task_is_learned():
    model = train_toy("reverse", steps=400, seed=0)
    assert exact_match(model, "reverse", n=500) >= 0.99
    assert exact_match(model, "reverse", n=200, beam_size=4) >= 0.99


def test_toy_batch_layout():
    src, tgt_in, tgt_out = toy_batch("reverse", 4, max_length=5,
                                     generator=torch.Generator().manual_seed(3))
    for s, ti, to in zip(src, tgt_in, tgt_out, strict=True):
        n = int((s > EOS).sum())
        x = s[:n]
        assert s[n] == EOS and (s[n + 1:] == PAD).all()
        assert ti[0] == BOS and torch.equal(ti[1:n + 1], x.flip(0))
        assert torch.equal(to[:n], x.flip(0)) and to[n] == EOS


def test_label_smoothed_loss_equals_pytorch_cross_entropy():
    model = make_model(label_smoothing=0.1)
    src = pad_batch(random_sources(3), PAD)
    tgt_out = pad_batch(random_sources(3, seed=1), PAD)  # pads at the end of short rows
    tgt_in = torch.cat([torch.full((3, 1), BOS), tgt_out[:, :-1]], dim=1)
    assert (tgt_out == PAD).any()
    logits, loss = model(src, tgt_in, tgt_out)
    want = F.cross_entropy(logits.reshape(-1, 17), tgt_out.reshape(-1), label_smoothing=0.1,
                           ignore_index=PAD)
    torch.testing.assert_close(loss, want)
    _, plain = model(src, tgt_in, tgt_out, label_smoothing=0.0)
    torch.testing.assert_close(plain, F.cross_entropy(logits.reshape(-1, 17),
                                                      tgt_out.reshape(-1), ignore_index=PAD))


def test_noam_schedule_matches_the_paper():
    # lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), d_model 512, warmup 4000
    assert noam_lr(1, 512, 4000) == pytest.approx(512 ** -0.5 * 4000 ** -1.5)
    assert noam_lr(1, 512, 4000) == pytest.approx(1.746928e-07, rel=1e-6)
    assert noam_lr(4000, 512, 4000) == pytest.approx(6.987712e-04, rel=1e-6)
    assert noam_lr(16000, 512, 4000) == pytest.approx(3.493856e-04, rel=1e-6)
    lrs = [noam_lr(s, 512, 4000) for s in range(1, 20001)]
    assert max(range(len(lrs)), key=lrs.__getitem__) + 1 == 4000


def test_cross_attention_shapes_and_rows():
    model = make_model(n_head=4, n_embd=16)
    src = pad_batch(random_sources(3), PAD)  # (3, S) with padding
    tgt = pad_batch([[BOS, 5, 6], [BOS, 7], [BOS, 8, 9, 10]], PAD)  # (3, T)
    _, _, internals = model(src, tgt, return_internals=True)
    b, t_src, t_tgt = 3, src.shape[1], tgt.shape[1]
    assert len(internals.cross_attentions) == 2
    assert len(internals.encoder.attentions) == len(internals.decoder.attentions) == 2
    for w in internals.cross_attentions:
        assert w.shape == (b, 4, t_tgt, t_src)
        torch.testing.assert_close(w.sum(-1), torch.ones(b, 4, t_tgt))
        pad_cols = (src == PAD)[:, None, None, :].expand_as(w)
        assert (w[pad_cols] == 0).all()  # nobody attends to source padding
    for w in internals.encoder.attentions:
        assert w.shape == (b, 4, t_src, t_src)
    for w in internals.decoder.attentions:
        assert w.shape == (b, 4, t_tgt, t_tgt)
        assert (w.triu(1) == 0).all()  # causal


@pytest.mark.parametrize("pos", ["sinusoidal", "learned", "rope", "alibi"])
def test_source_padding_changes_nothing(pos):
    model = make_model(pos_encoding=pos)
    sources = random_sources(5, seed=2)
    batch = pad_batch(sources, PAD)
    together = greedy_decode(model, batch, max_len=8).tokens
    beam_together = beam_search(model, batch, 3, max_len=8).tokens
    for i, s in enumerate(sources):
        alone = torch.tensor([s])
        padded = torch.tensor([s + [PAD] * 6])
        assert greedy_decode(model, alone, max_len=8).tokens[0] == together[i]
        assert greedy_decode(model, padded, max_len=8).tokens[0] == together[i]
        assert beam_search(model, alone, 3, max_len=8).tokens[0] == beam_together[i]
        tgt = torch.tensor([[BOS] + together[i]])
        torch.testing.assert_close(model(padded, tgt)[0], model(alone, tgt)[0],
                                   atol=1e-5, rtol=1e-5)
    assert len({tuple(t) for t in together}) > 1  # the model does depend on its input


@pytest.mark.parametrize("pos", ["sinusoidal", "learned", "rope", "alibi"])
def test_cached_decoder_equals_recomputing(pos):
    model = make_model(pos_encoding=pos)
    src = pad_batch(random_sources(4, seed=3), PAD)
    for use in (greedy_decode, lambda m, s, **kw: beam_search(m, s, 3, **kw)):
        cached = use(model, src, max_len=10, use_cache=True)
        full = use(model, src, max_len=10, use_cache=False)
        assert cached.tokens == full.tokens
        assert cached.scores == pytest.approx(full.scores, abs=1e-4)
    # Logits, step by step through the cache vs the whole target at once.
    memory, mask, _ = model.encode(src)
    tgt = torch.randint(3, 17, (4, 7))
    tgt[:, 0] = BOS
    whole, _ = model.decode(tgt, memory, mask)  # (B, T, V)
    cache = model.new_cache()
    steps = [model.decode(tgt[:, i:i + 1], memory, mask, cache)[0] for i in range(7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, atol=1e-5, rtol=1e-5)


def test_paper_defaults_and_shared_embedding():
    c = Seq2SeqConfig()
    assert (c.n_layer, c.n_embd, c.n_head, c.ffn_width) == (6, 512, 8, 2048)
    assert (c.norm_position, c.activation, c.pos_encoding, c.init) == \
        ("post", "relu", "sinusoidal", "xavier")
    assert (c.dropout, c.label_smoothing, c.scale_embeddings) == (0.1, 0.1, True)
    model = make_model(scale=None, n_encoder_layer=3, n_decoder_layer=1)
    assert model.lm_head.weight is model.tok_emb.weight
    assert len(model.encoder.layers) == 3 and len(model.decoder.layers) == 1
    assert all(layer.cross_attn is not None for layer in model.decoder.layers)
    # embeddings are multiplied by sqrt(d_model) before the positions are added
    x, tok, pos = model.embed(torch.tensor([[5, 6]]))
    torch.testing.assert_close(tok, model.tok_emb.weight[[5, 6]][None] * 4.0)
    torch.testing.assert_close(x, tok + pos)
    with pytest.raises(ConfigError):
        Seq2SeqConfig(n_embd=30, n_head=4)
    with pytest.raises(ConfigError):
        Seq2SeqConfig(vocab_size=2)
    with pytest.raises(ConfigError):
        Seq2SeqConfig(label_smoothing=1.0)


def test_checkpoint_round_trip(tmp_path):
    fam = FAMILIES["seq2seq"]
    assert (fam.config_class, fam.model_class) == (Seq2SeqConfig, Seq2SeqTransformer)
    model = make_model()
    tok = BPETokenizer.train(["a b c", "d e f"] * 5, vocab_size=40)
    meta = {"format": "minitransformer", "version": 1, "family": "seq2seq",
            "model": dataclasses.asdict(model.config)}
    ckpt.write_model_files(tmp_path, model, meta, tok)
    loaded, tok2 = load_checkpoint(tmp_path)
    src = pad_batch(random_sources(2), PAD)
    tgt = torch.tensor([[BOS, 4, 5], [BOS, 6, 7]])
    torch.testing.assert_close(loaded(src, tgt)[0], model(src, tgt)[0])
    assert loaded.lm_head.weight is loaded.tok_emb.weight
    assert tok2.encode("a b") == tok.encode("a b")


def test_pre_ln_gelu_variant_trains_a_step():
    model = make_model(scale=None, norm_position="pre", activation="gelu", init="gpt2")
    model.train()
    src, tgt_in, tgt_out = toy_batch("copy", 8, vocab_size=17)
    _, loss = model(src, tgt_in, tgt_out)
    loss.backward()
    assert math.isfinite(loss.item())
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_train_toy_runs_on_one_thread_and_gives_the_count_back(monkeypatch):
    """A model this small trains several times faster on one thread: the library function
    (docs/seq2seq.md's snippet) takes one as the command does, and restores the count."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before, seen = torch.get_num_threads(), []
    train_toy("copy", steps=2, log=lambda _: seen.append(torch.get_num_threads()))
    assert seen == [1] and torch.get_num_threads() == before
