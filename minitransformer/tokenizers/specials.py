"""Where a model's own special tokens go: before a prompt, and between documents.

A Hugging Face ``tokenizer.json`` may hold a post-processor, the step that adds a model's own
special tokens around a text: Llama's puts ``<s>`` first (Llama 3's ``<|begin_of_text|>``),
BERT's writes ``[CLS] text [SEP]``, GPT-2's and Qwen's add nothing. transformers'
``tokenizer(text)`` runs it, so the usual ``model.generate(**tokenizer(prompt))`` continues
``<s> prompt``, and so do vLLM's completions and llama.cpp. A model pretrained with ``<s>``
before every document reads a text without it as something it has never seen at position 0.

Prompts (``prompt_ids``: ``sample``, ``serve``, the pages that show a forward pass) are the
post-processor's leading special tokens, then the text's ids; never its trailing ones (BERT's
[SEP], an ``</s>``): a text to continue has not ended. A prompt whose own ids already begin
with them gets no second copy. Our own tokenizers have no post-processor, so their prompts
are their text's ids.

Documents of a GPT's training text (``document_separator``) are kept apart by GPT-2's
``<|endoftext|>`` where the tokenizer has it as a special token (ours, GPT-2's, Qwen's). A
tokenizer without it ends a document with its own end token and begins the next as it begins
a prompt: ``</s><s>`` for Llama, as its pretraining packed documents. Written as text, the
string ``<|endoftext|>`` would be about eight ordinary tokens there.

    prompt_ids(tokenizer, "Once upon")       # Llama's: [1, ...], GPT-2's: [...]
    document_separator(tokenizer, "<|endoftext|>")   # Llama's: "</s><s>"
"""

from __future__ import annotations

import json

from tokenizers import Tokenizer

PROBE = "a"  # a text every tokenizer encodes to at least one token of its own
# End-of-text tokens by the names models give them: Llama 1-2 and Mistral, Llama 3, Gemma.
END_TOKENS = ("</s>", "<|end_of_text|>", "<eos>")


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


def start_tokens(tokenizer) -> int:
    """How many start tokens ``tokenizer`` (ours, or a Hugging Face folder's, wrapped) puts
    before every prompt: Llama's ``<s>`` 1, ours, GPT-2's and Qwen's 0. Generation keeps them
    in every window once the text outgrows it (``context_keep``)."""
    return len(tokenizer.encode_prompt(""))


def unknown_id(tokenizer: Tokenizer) -> int | None:
    """The id unknown text becomes: the model's own unknown token (WordPiece's [UNK], a BPE's
    unk_token, a Unigram's unk_id, which only its JSON holds), else <unk> where the vocabulary
    has it."""
    model = tokenizer.model
    name = getattr(model, "unk_token", None)
    if isinstance(name, str) and (found := tokenizer.token_to_id(name)) is not None:
        return found
    if type(model).__name__ == "Unigram":
        index = json.loads(tokenizer.to_str())["model"].get("unk_id")
        if isinstance(index, int):
            return index
    return tokenizer.token_to_id("<unk>")


def special_tokens(tokenizer: Tokenizer) -> set[str]:
    """The tokens the tokenizer marks special (its added tokens with ``special``)."""
    return {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}


def end_token(tokenizer: Tokenizer, wanted: str) -> str | None:
    """The token that ends a document: ``wanted`` (GPT-2's <|endoftext|>) where it is one of
    the tokenizer's special tokens, else the first of ``END_TOKENS`` that is; else None."""
    specials = special_tokens(tokenizer)
    return next((t for t in (wanted, *END_TOKENS) if t in specials), None)


def document_separator(tokenizer: Tokenizer, wanted: str) -> str:
    """The text between two documents: ``wanted`` where the tokenizer has that special
    token; else its end token (``end_token``), then its leading specials; else a blank
    line."""
    end = end_token(tokenizer, wanted)
    if end is None or end == wanted:
        return end or "\n\n"
    return end + "".join(tokenizer.id_to_token(i) for i in leading_specials(tokenizer))


__all__ = ["END_TOKENS", "document_separator", "end_token", "leading_specials", "prompt_ids",
           "special_tokens", "start_tokens", "unknown_id"]
