"""``prepare``: fit a tokenizer on the sources, then stream them into a DATA_DIR's shards.

    sources -> documents (sources.py) -> tokenizer (a full pass for the char alphabet; BPE
    trained on the text) -> token file + manifest (shards.py)
"""

from __future__ import annotations

import sys

from tqdm.auto import tqdm

from ..errors import UserError
from ..tokenizers import CharTokenizer, fit_tokenizer
from .shards import write_shards
from .sources import fingerprint, read_documents, source_files

CHAR_SEPARATOR = "\n\n"  # between prepared documents, for a char tokenizer


def prepare_corpus(sources: list[str], out, kind: str | None, vocab: int | None,
                   special_tokens: tuple[str, ...] = (), bpe_separator: str = "\n\n",
                   text_field: str = "text", val_fraction: float = 0.1, encoding: str = "utf-8",
                   errors: str = "strict", echo=print) -> dict:
    """Fit the tokenizer on the sources (with the family's ``special_tokens``; documents
    apart by ``bpe_separator`` for BPE, a blank line for characters) and write ``out``."""
    files = source_files(sources)
    kind = kind or "char"
    fitted = fit_streamed(files, kind, vocab, special_tokens, text_field, encoding, errors)
    separator = bpe_separator if fitted.kind != "char" else CHAR_SEPARATOR
    total = sum(p.stat().st_size for p in files)
    with tqdm(total=total, unit="B", unit_scale=True, desc="prepare",
              disable=not sys.stderr.isatty() or None) as bar:
        manifest = write_shards(read_documents(files, text_field, encoding, errors), fitted,
                                out, fingerprint(files), val_fraction,
                                separator=separator, progress=bar.update)
    echo(f"prepared {manifest['tokens']:,} tokens from {manifest['documents']:,} document(s) "
         f"of {len(files)} file(s) into {out} ({fitted.kind} tokenizer, "
         f"{fitted.vocab_size:,} ids, {manifest['dtype']}); train on it: minitransformer "
         f"train --data {out} --out RUN")
    return manifest


def fit_streamed(files, kind: str, vocab: int | None, special_tokens: tuple[str, ...],
                 text_field: str, encoding: str, errors: str):
    """The tokenizer of the sources: every character of every document, or BPE on the text."""
    docs = read_documents(files, text_field, encoding, errors)
    if kind == "char":
        alphabet: set[str] = set()
        for i, doc in enumerate(docs):
            alphabet.update(doc.text if i == 0 else CHAR_SEPARATOR + doc.text)
        if not alphabet:
            raise UserError("the sources hold no text: nothing to prepare")
        return CharTokenizer(sorted(alphabet))
    text = "\n".join(doc.text for doc in docs)
    return fit_tokenizer(kind, text, vocab, *((special_tokens,) if special_tokens else ()))
