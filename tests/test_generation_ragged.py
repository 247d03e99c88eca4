"""Ragged batches: prompts of different lengths decoded together equal each decoded alone.

The reference is ``GPT.generate`` on one prompt (batch 1, no padding, the default context
shift). In fp64 the padded batch and the single row agree far below any argmax tie, so greedy
texts are equal token for token, past the window too (each row's window moves on its own).
"""

from __future__ import annotations

import threading

import pytest
import torch

from minitransformer.models.ragged import RaggedBatch, generate_ragged
from minitransformer.nn import kv_cache
from minitransformer.serve import completions as cmpl
from minitransformer.serve.schemas import CompletionRequest
from minitransformer.tokenizers import CharTokenizer

LENGTHS = (1, 6, 11, 16)  # block_size 16: the last prompt fills the window
WANTS = (30, 4, 17, 9)  # rows 0, 2, 3 pass the window at different steps


def alone(model, prompt: list[int], n: int, keep: int = 0) -> list[int]:
    idx = torch.tensor([prompt])
    return model.generate(idx, n, temperature=0.0, context_keep=keep)[0, len(prompt):].tolist()


@pytest.mark.parametrize("kw", [dict(pos_encoding="sinusoidal"), dict(pos_encoding="learned"),
                                dict(pos_encoding="rope"), dict(pos_encoding="alibi"),
                                dict(pos_encoding="none"),
                                dict(pos_encoding="rope", n_kv_head=1, qk_norm=True,
                                     norm_position="pre", norm="rmsnorm")])
def test_ragged_greedy_equals_each_row_alone_in_fp64(make_gpt, kw):
    model = make_gpt(scale=0.4, **kw).double()
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 13, (n,), generator=gen).tolist() for n in LENGTHS]
    got = generate_ragged(model, prompts, WANTS, temperature=0.0)
    for prompt, want, tokens in zip(prompts, WANTS, got, strict=True):
        assert tokens == alone(model, prompt, want)


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_ragged_rows_keep_their_own_first_tokens_as_each_alone(make_gpt, pos):
    model = make_gpt(scale=0.4, pos_encoding=pos).double()
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 13, (n,), generator=gen).tolist() for n in LENGTHS]
    got = generate_ragged(model, prompts, WANTS, temperature=0.0, context_keep=2)
    for prompt, want, tokens in zip(prompts, WANTS, got, strict=True):
        assert tokens == alone(model, prompt, want, keep=2)


@pytest.mark.parametrize("pos", ["sinusoidal", "learned", "rope", "alibi", "none"])
def test_ragged_logits_equal_the_uncached_model_on_each_row(make_gpt, pos):
    # Prefill, then cached steps: every row's logits are the model's on that row alone.
    model = make_gpt(scale=0.4, pos_encoding=pos).double()
    batch = RaggedBatch(model, [[1], [2, 3, 4, 5, 6], [7, 8, 9]])
    for _ in range(4):
        logits = batch.next_logits()  # (3, V)
        for b, r in enumerate(batch.rows):
            ref = model(torch.tensor([batch.texts[r]]))[0][0, -1]  # (V,)
            torch.testing.assert_close(logits[b], ref, rtol=0, atol=1e-10)
        batch.push(logits.argmax(-1))


def test_pads_are_hidden_whatever_their_id(make_gpt):
    model = make_gpt(scale=0.4, pos_encoding="rope").double()
    prompts = [[1, 2], [3, 4, 5, 6, 7]]
    a = RaggedBatch(model, prompts, pad_id=0).next_logits()
    b = RaggedBatch(model, prompts, pad_id=9).next_logits()
    assert torch.equal(a, b) and a.isfinite().all()


def test_finished_rows_leave_and_all_pad_columns_go(make_gpt):
    model = make_gpt(scale=0.4, pos_encoding="learned").double()
    batch = RaggedBatch(model, [[1], [2, 3, 4, 5]])
    batch.push(batch.next_logits().argmax(-1))
    batch.next_logits()
    batch.finish([1])  # the long row leaves: row 0's three pad columns are dropped
    assert batch.rows == [0] and batch.pad.tolist() == [0]
    assert batch.cache[0][0].length == 2  # row 0's own two tokens
    batch.push(batch.next_logits().argmax(-1))
    assert batch.texts[0][1:] == alone(model, [1], 2)


def test_rows_leaving_outside_inference_mode_reuse_the_caches_second_buffer(make_gpt,
                                                                            monkeypatch):
    """The server takes finished rows out between steps, outside inference mode: the reorder's
    second buffer, made at an earlier one inside it, must still serve (not new storage at
    every reorder)."""
    model = make_gpt(scale=0.4)
    batch = RaggedBatch(model, [[1, 2], [3], [4, 5, 6], [7]])
    taken = []
    take = kv_cache.take_storage

    def counting(*args):
        taken.append(args[1])
        return take(*args)
    monkeypatch.setattr(kv_cache, "take_storage", counting)
    for leaving in (0, 1, 2):
        batch.push(batch.next_logits().argmax(-1))
        batch.finish([leaving])
    layers = len(model.decoder.layers)
    # the prefill's storage and the first reorder's second buffer, then no more
    assert batch.rows == [3] and len(taken) == 2 * layers


class FakeJob:
    def __init__(self, plan):
        self.payload, self.events, self.cancelled = plan, [], threading.Event()

    def emit(self, event):
        self.events.append(event)


def test_the_server_batches_requests_of_different_prompt_lengths(make_gpt):
    tok = CharTokenizer.fit("abcdefgh ")
    model = make_gpt(scale=0.4, vocab_size=tok.vocab_size).double()
    asks = [("a", 12), ("bcdefgh", 3), ("hgfe", 0), ("ab cd", 7)]
    plans = [cmpl.plan_completion(CompletionRequest(model="m", prompt=p, max_tokens=n,
                                                    temperature=0), tok, 64, 64)
             for p, n in asks]
    assert len({cmpl.batch_key(p) for p in plans}) == 1  # one batch, whatever the lengths
    jobs = [FakeJob(p) for p in plans]
    usage = cmpl.run_batch(jobs, model, tok)
    for (prompt, n), job, use in zip(asks, jobs, usage, strict=True):
        text = "".join(piece["text"] for kind, pieces in job.events if kind == "pieces"
                       for piece in pieces)
        assert text == tok.decode(alone(model, tok.encode(prompt), n))
        assert use["completion_tokens"] == n
