"""EncoderModel and BERT's masked-LM corruption, checked against hand-derived properties."""

import pytest
import torch

from minitransformer.config import EncoderConfig
from minitransformer.errors import ConfigError
from minitransformer.models import EncoderModel, mlm
from minitransformer.models.encoder import mean_pool
from minitransformer.training.mlm import MaskedLMTask


def tiny(**kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=16, mask_id=39)
    return EncoderModel(EncoderConfig(**{**cfg, **kw})).eval()


def test_every_position_sees_the_future():
    """Unlike GPT, changing the last token changes the first position's output."""
    model = tiny(init="xavier")  # larger weights than gpt2's 0.02: a clear difference
    ids = torch.randint(39, (1, 10), generator=torch.Generator().manual_seed(1))
    other = ids.clone()
    other[0, -1] = (ids[0, -1] + 1) % 39
    with torch.no_grad():
        a, b = model(ids)[0], model(other)[0]
    assert (a[0, 0] - b[0, 0]).abs().max() > 1e-3


def test_padding_is_invisible():
    """Appending padding (masked out) leaves the real positions' outputs unchanged."""
    model = tiny()
    ids = torch.randint(39, (1, 7), generator=torch.Generator().manual_seed(2))
    padded = torch.cat([ids, torch.zeros(1, 5, dtype=torch.long)], dim=1)
    mask = torch.tensor([[1] * 7 + [0] * 5])
    with torch.no_grad():
        a = model(ids)[0]
        b = model(padded, attention_mask=mask)[0]
    assert torch.allclose(a, b[:, :7], atol=1e-5)
    emb_a = model.embed(ids)
    emb_b = model.embed(padded, mask)
    assert torch.allclose(emb_a, emb_b, atol=1e-5)


def test_mean_pool_by_hand():
    h = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])  # (1, 3, 2)
    assert mean_pool(h, torch.tensor([[1, 1, 0]])).tolist() == [[2.0, 3.0]]


def test_internals_for_the_attention_view():
    model = tiny()
    ids = torch.randint(39, (2, 9))
    logits, loss, internals = model(ids, return_internals=True)
    assert logits.shape == (2, 9, 40) and loss is None
    assert len(internals.attentions) == 2 and len(internals.hidden_states) == 3
    att = internals.attentions[0]
    assert att.shape == (2, 2, 9, 9)
    assert torch.allclose(att.sum(-1), torch.ones(2, 2, 9), atol=1e-5)
    assert att[:, :, 0, 1:].sum() > 0  # the first token attends ahead: no causal mask
    with torch.no_grad():
        assert torch.allclose(model(ids)[0], logits, atol=1e-5)  # fast path = reference path
    assert internals.token_embeddings.shape == (2, 9, 16)


def test_options():
    m = tiny(type_vocab_size=2, embedding_norm="none", mlm_head="linear", tie_weights=False)
    assert m.type_emb.weight.shape == (2, 16) and m.mlm_head.transform is None
    assert m.mlm_head.decoder.weight is not m.tok_emb.weight
    headless = tiny(mlm_head="none")
    out, _ = headless(torch.randint(39, (1, 5)))
    assert out.shape == (1, 5, 16)  # hidden states when there is no head
    with pytest.raises(ValueError, match="no masked-LM head"):
        headless(torch.randint(39, (1, 5)), torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ConfigError):
        EncoderConfig(vocab_size=10, mask_id=10)
    with pytest.raises(ConfigError):
        EncoderConfig(mlm_head="gpt")


def test_tied_head_shares_the_embedding():
    m = tiny()
    assert m.mlm_head.decoder.weight is m.tok_emb.weight
    assert m.num_params() == sum(p.numel() for p in set(m.parameters()))


def test_mask_tokens_proportions():
    """15% chosen; of those 80% [MASK], 10% random, 10% unchanged (BERT, section 3.1)."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 1000, (200, 500), generator=gen)
    inputs, targets = mlm.mask_tokens(ids, 0, 1000, gen)
    chosen = targets != mlm.IGNORE
    n = chosen.sum().item()
    assert n / ids.numel() == pytest.approx(0.15, abs=0.005)
    assert torch.equal(targets[chosen], ids[chosen])
    assert torch.equal(inputs[~chosen], ids[~chosen])
    masked = (inputs == 0) & chosen
    kept = (inputs == ids) & chosen
    other = chosen & ~masked & ~kept
    assert masked.sum().item() / n == pytest.approx(0.8, abs=0.01)
    assert kept.sum().item() / n == pytest.approx(0.1 + 0.1 / 1000, abs=0.01)
    assert other.sum().item() / n == pytest.approx(0.1, abs=0.01)


def test_mask_tokens_edges():
    gen = torch.Generator().manual_seed(0)
    ids = torch.arange(8).repeat(50, 1)  # (50, 8)
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, :2] = True
    _, targets = mlm.mask_tokens(ids, 9, 10, gen, special=special)
    chosen = targets != mlm.IGNORE
    assert chosen.any(dim=1).all()  # every row has something to predict
    assert not chosen[:, :2].any()  # special positions never chosen
    acc = mlm.masked_accuracy(torch.nn.functional.one_hot(ids, 10).float(), targets)
    assert acc == (chosen.sum().item(), chosen.sum().item())


def test_task_batches_are_reproducible():
    data = torch.randint(0, 20, (1000,))
    task = MaskedLMTask(data[:900], data[900:], 16, mask_id=20, vocab_size=21)
    a = task.batch("train", 4, torch.Generator().manual_seed(3))
    b = task.batch("train", 4, torch.Generator().manual_seed(3))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert a[0].shape == a[1].shape == (4, 16)
    assert task.tokens(a) == 64


def test_forward_without_internals_skips_the_attention_weights(monkeypatch):
    """Masked-LM training (return_internals=False) takes the fused path and keeps no attention
    maps; its logits and loss equal the reference path's (return_internals=True)."""
    from minitransformer.nn import attention

    model = tiny(attn_impl="fast", init="xavier")
    ids = torch.randint(39, (2, 9), generator=torch.Generator().manual_seed(3))
    targets = torch.full((2, 9), -1)
    targets[:, 2] = ids[:, 2]
    mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3])
    with torch.no_grad():
        ref_out, ref_loss, internals = model(ids, targets, return_internals=True,
                                             attention_mask=mask)
    assert len(internals.attentions) == 2  # the reference path ran for the internals
    calls = []
    reference = attention.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(1)
        return reference(*args, **kwargs)

    monkeypatch.setattr(attention, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        result = model(ids, targets, attention_mask=mask)
    assert calls == []  # no explicit softmax, no weights kept
    assert len(result) == 2
    out, loss = result
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-4)


def test_training_projects_only_the_chosen_positions_onto_the_vocabulary():
    """The task's loss sends only the chosen positions through the masked-LM head, and its
    sum and count equal the cross-entropy of the full logits computed by hand."""
    model = tiny(init="xavier", mlm_head="bert")
    data = torch.randint(0, 39, (1000,), generator=torch.Generator().manual_seed(4))
    task = MaskedLMTask(data[:900], data[900:], 16, mask_id=39, vocab_size=40)
    x, y = task.batch("train", 4, torch.Generator().manual_seed(5))
    rows = []
    model.mlm_head.register_forward_hook(lambda m, args, out: rows.append(args[0].shape))
    total, n = task.loss_terms(model, (x, y))
    chosen = y != mlm.IGNORE
    assert rows == [(int(chosen.sum()), 16)]  # (N, C): the chosen positions alone
    assert 0 < int(n) == int(chosen.sum()) < y.numel()
    with torch.no_grad():
        full = model(x)[0]  # (B, T, V): every position
    logp = torch.log_softmax(full[chosen], dim=-1)  # (N, V)
    want = -logp.gather(1, y[chosen][:, None]).sum()
    torch.testing.assert_close(total.detach(), want, atol=1e-5, rtol=1e-5)
    out, loss = model(x, y, targets_only=True)
    assert out.shape == (int(n), 40)
    torch.testing.assert_close(loss, model(x, y)[1], atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="needs targets"):
        model(x, targets_only=True)
    # the accuracy, from the chosen positions' logits, is the full logits' accuracy
    gen = torch.Generator().manual_seed(0)
    right = total = 0
    for _ in range(3):
        xb, yb = task.batch("val", 4, gen)
        r, n = mlm.masked_accuracy(model(xb)[0], yb)
        right, total = right + r, total + n
    assert task.accuracy(model, "val", 4, 3, "cpu")[0] == right / total


def test_evaluate_refuses_an_encoder_without_a_head():
    """Scoring masked tokens needs the head: a headless encoder (an embedding model) is
    refused, as fill refuses it (it was an internal error, and before that hidden states
    scored as if they were logits)."""
    from minitransformer.families import FAMILIES, NotApplicable

    model = tiny(mlm_head="none")
    with pytest.raises(NotApplicable, match="no masked-LM head.*, and evaluate scores"):
        FAMILIES["encoder"].evaluate(model, None, {}, {}, "cpu")


def test_the_sample_line_is_a_quick_look_apart_from_the_final_accuracy():
    """The sample's accuracy is over its own 64 windows (16 x 4, seeded), not the final
    line's batch_size x eval_iters: it says so, so that two figures for one model do not
    read as the same measurement."""
    from minitransformer.tokenizers import CharTokenizer

    tok = CharTokenizer.fit("abcdefghij klmnopqrstuvwxyz.\n" * 3)
    data = torch.randint(0, tok.vocab_size, (1000,), generator=torch.Generator().manual_seed(6))
    model = tiny(vocab_size=tok.vocab_size + 1, mask_id=tok.vocab_size)
    task = MaskedLMTask(data[:900], data[900:], 16, mask_id=tok.vocab_size,
                        vocab_size=tok.vocab_size + 1)
    text = task.sample(model, tok, 16, "cpu")
    acc, base = task.accuracy(model, "val", 16, 4, "cpu")
    assert (f"a quick look at 64 val windows: masked-token accuracy {acc:.1%}, "
            f"most-frequent-token baseline {base:.1%}") in text, text
