"""The ids a model continues: a prompt begins as the model's tokenizer begins a text.

A Hugging Face ``tokenizer.json`` may hold a post-processor, the step that adds a model's own
special tokens around a text: Llama's puts ``<s>`` first (Llama 3's ``<|begin_of_text|>``),
BERT's writes ``[CLS] text [SEP]``, GPT-2's and Qwen's add nothing. transformers'
``tokenizer(text)`` runs it, so the usual ``model.generate(**tokenizer(prompt))`` continues
``<s> prompt``, and so do vLLM's completions and llama.cpp. A model pretrained with ``<s>``
before every document reads a text without it as something it has never seen at position 0.

So a prompt (``sample``, ``serve``) is the post-processor's leading special tokens, then the
text's ids; never its trailing ones (BERT's [SEP], an ``</s>``): a text to continue has not
ended. A prompt whose own ids already begin with them gets no second copy. Our own
tokenizers have no post-processor, so their prompts are their text's ids. Training text is
read without them (documents are joined by a blank line, docs/finetune.md).

    prompt_ids(tokenizer, "Once upon")   # Llama's: [1, ...], GPT-2's: [...]
"""

from __future__ import annotations

from tokenizers import Tokenizer

PROBE = "a"  # a text every tokenizer encodes to at least one token of its own


def leading_specials(tokenizer: Tokenizer) -> list[int]:
    """The special tokens the post-processor puts before a text ([] where it puts none)."""
    enc = tokenizer.encode(PROBE, add_special_tokens=True)
    mask = enc.special_tokens_mask  # 1 where the post-processor added the token
    n = next((i for i, added in enumerate(mask) if not added), None)
    return [] if n is None else enc.ids[:n]


def prompt_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """The ids of ``text`` as a prompt: ``leading_specials`` first, unless already there."""
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    lead = leading_specials(tokenizer)
    return ids if ids[:len(lead)] == lead else lead + ids


__all__ = ["leading_specials", "prompt_ids"]
