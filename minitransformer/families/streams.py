"""What the families trained on one token stream share: GPT (next token) and the encoder
(masked tokens) read a text, fit characters or byte-level BPE, split it 90/10 as nanoGPT does,
and measure val loss on random windows of the context.

The stream is always a memory map: a DATA_DIR from ``prepare`` as it is, any other source
prepared once into the cache (``data/cache.py``) and read from there. Only a Hugging Face
folder's tokenizer (``--init_from``) still encodes its text in memory."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import torch

from ..data import check_length, split_ids
from ..data.cache import (
    Cached,
    check_sources,
    find_cached,
    prepare_cached,
    read_texts,
    recorded_source,
)
from ..data.prepare import prepare_corpus
from ..data.shards import TOKENIZER, is_prepared, joined, open_shards, record_family
from ..data.sources import check_text_field, source_files
from ..errors import UserError
from ..tokenizers import UnknownCharactersError, load_tokenizer
from ..training.device import pick_dtype
from ..training.task import check_divisible
from ..training.trainer import estimate_loss
from .base import Family, NotApplicable, Prepared, as_named_now, data_source, train_config


def as_sources(source: str | list[str]) -> list[str]:
    """--data as a list (a run's config.json holds one source as a string)."""
    return [source] if isinstance(source, str) else list(source)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def note_resplit(data: dict, prepared: Prepared) -> None:
    """A run's own text, unchanged, prepared again (its cache removed) into other tokens than
    the run recorded: said, as its val split is then not the one the run measured and a resume
    on it not exact. A recorded split that is not two counts (a damaged config.json) is not
    compared."""
    was, now = data.get("split"), prepared.data_meta.get("split")
    if not (isinstance(was, list) and len(was) == 2 and all(type(n) is int for n in was)) \
            or was == now or os.environ.get("RANK", "0") != "0":  # torchrun: said once
        return
    _stderr(f"note: the run's text, prepared again, holds {now[0]:,} train / {now[1]:,} val "
            f"tokens where the run recorded {was[0]:,} / {was[1]:,} (this version encodes or "
            f"splits it otherwise): it is read as it is now, so its val split is not the one "
            f"the run measured and a resume does not continue exactly")


def with_field(text_field: str) -> dict:
    """What a run records of its text field: nothing for the default, "text"."""
    return {} if text_field == "text" else {"text_field": text_field}


def refuse_reading_of_prepared(folder: str, text_field: str | None,
                               newline: str | None = None) -> None:
    """How to read text (--text_field, --newline) does not apply to a prepared folder: its
    text was read when it was prepared."""
    for flag, value in (("--text_field", text_field), ("--newline", newline)):
        if value is not None:
            raise NotApplicable(f"{flag} {value}: {folder} is prepared, its text was read "
                                f"when it was (prepare {flag}); drop the flag")


def refuse_mixed(sources: list[str]) -> None:
    """A prepared folder among several sources: it is read alone, not as text."""
    if len(sources) > 1 and (folders := [s for s in sources if is_prepared(s)]):
        raise NotApplicable(f"--data {folders[0]} is a prepared folder: it is read alone; "
                            f"prepare the sources together instead (minitransformer "
                            f"prepare --data A --data B --out DATA_DIR)")


class StreamFamily(Family):
    """A family whose data is one token stream (see the module docstring)."""

    special_tokens: tuple[str, ...] = ()
    bpe_separator = "\n\n"  # what a BPE stream puts between prepared documents
    evaluate_options = frozenset({"data", "encoding", "text_field", "eval_iters", "batch_size",
                                  "seed"})

    def check_batch_split(self, batch_size: int, world_size: int, grad_accum: int) -> None:
        check_divisible(batch_size, world_size, grad_accum)  # rows of equal length

    def tokenizer_extras(self, tokenizer) -> dict:
        """Ids the family adds beside the tokenizer's own (the encoder's [MASK])."""
        return {}

    def separator(self, tokenizer=None) -> str:
        """What a BPE stream of ``tokenizer`` (None: one fitted here) puts between documents."""
        return self.bpe_separator

    def cache_family(self, tokenizer=None) -> dict:
        """What of the family decides a cached folder's tokens (part of its key)."""
        return {"name": self.name, "special_tokens": list(self.special_tokens),
                "separator": self.separator(tokenizer)}

    def prepare(self, source: str | list[str], encoding: str, fields: dict, kind: str | None,
                source_tgt: str | None = None, newline: str | None = None,
                text_field: str | None = None) -> Prepared:
        """A DATA_DIR as it is; any other source (files, folders, globs, JSONL, tables, several
        of them) prepared into the cache once, then read from there as a DATA_DIR is."""
        if source_tgt:
            raise NotApplicable(f"--data_tgt is for sentence pairs; {self.a_title} reads one "
                                f"text (--model seq2seq translates)")
        sources = as_sources(source)
        if len(sources) == 1 and is_prepared(sources[0]):
            refuse_reading_of_prepared(sources[0], text_field, newline)
            return self._open_prepared(sources[0], kind)
        refuse_mixed(sources)
        kind = kind or "char"
        vocab = fields.get("vocab_size") if kind != "char" else None
        mode = newline or "normalize"
        field = "text" if text_field is None else text_field
        cached = prepare_cached(sources, self.cache_family(), kind, vocab, encoding, mode,
                                text_field=field)
        return self._open_cached(cached, sources, encoding, mode, text_field=field)

    def reopen(self, meta: dict, tokenizer, source: str | list[str], encoding: str,
               source_tgt: str | None = None, newline: str | None = None,
               text_field: str | None = None) -> Prepared:
        sources = as_sources(source)
        data = meta.get("data", {})
        if len(sources) == 1 and (is_prepared(sources[0]) or (
                data.get("prepared") and source == data.get("source"))):
            refuse_reading_of_prepared(sources[0], text_field, newline)
            return self._reopen_prepared(sources[0], tokenizer, data)
        refuse_mixed(sources)
        mode = newline or data.get("newline", "normalize")
        own = recorded_source(sources) == data.get("source")  # the run's text, however named
        recorded_field = data.get("text_field", "text")
        field = text_field if text_field is not None else recorded_field if own else "text"
        if not hasattr(tokenizer, "to_dict"):  # a Hugging Face folder's: encoded in memory
            files = source_files(sources)
            check_text_field(files, field)
            counted: list[int] = []
            docs = read_texts(files, encoding, mode, counted, text_field=field)
            text = self.separator(tokenizer).join(doc.text for doc in docs)  # as prepare does
            return self._encode(text, tokenizer, source, encoding, mode, sum(counted), field)
        same = own  # as recorded (a relative path to it too): checked, its cache reused
        if same:
            check_sources(data, sources)
        cached = find_cached(data.get("cache"), tokenizer) \
            if same and field == recorded_field else None
        cached = cached or prepare_cached(sources, self.cache_family(tokenizer), tokenizer.kind,
                                          None, encoding, mode, tokenizer=tokenizer,
                                          echo=_stderr, say_reused=False, text_field=field)
        prepared = self._open_cached(cached, sources, encoding, mode, tokenizer, field)
        if same and data.get("sources") and field == recorded_field:  # checked unchanged
            note_resplit(data, prepared)
        return prepared

    def _reopen_prepared(self, folder: str, tokenizer, data: dict) -> Prepared:
        if not is_prepared(folder):
            raise UserError(f"this run was trained on the prepared data {folder}, which is not "
                            f"there any more; pass --data to point at it (or prepare it again)")
        prepared = self._open_prepared(folder, None)
        if not hasattr(tokenizer, "to_dict"):
            raise NotApplicable(f"{folder} holds ids of its own tokenizer, not of the Hugging "
                                f"Face folder's; pass --data with the text itself")
        if prepared.tokenizer.to_dict() != tokenizer.to_dict():
            raise NotApplicable(f"{folder} was prepared with another tokenizer "
                                f"({prepared.tokenizer.kind}, {prepared.tokenizer.vocab_size:,} "
                                f"ids) than this run's ({tokenizer.kind}, "
                                f"{tokenizer.vocab_size:,} ids); prepare the text with its "
                                f"tokenizer (prepare --tokenizer_from and the run's folder or "
                                f"the one it starts from), or pass --data with a text file")
        return prepared

    def _open_cached(self, cached: Cached, sources: list[str], encoding: str, mode: str,
                     tokenizer=None, text_field: str = "text") -> Prepared:
        """A cached DATA_DIR read as the sources themselves: config.json names the sources
        (absolute, with their fingerprints), not the cache."""
        manifest, train_ids, val_ids = open_shards(cached.folder)
        tokenizer = tokenizer or load_tokenizer(cached.folder / TOKENIZER)
        data_meta = {"source": recorded_source(sources), "encoding": encoding,
                     "tokenizer": tokenizer.kind, "newline": mode,
                     "sources": manifest.get("sources", []), "cache": cached.folder.name,
                     "split": [len(train_ids), len(val_ids)], **with_field(text_field)}
        note = f"; {cached.crlf:,} CRLF line ends read as \\n (--newline keep keeps them)" \
            if cached.crlf else ""
        docs = f" in {manifest['documents']:,} documents" if manifest["documents"] > 1 else ""
        return Prepared(", ".join(sources), encoding, tokenizer, data_meta, train_ids, val_ids,
                        extra=self.tokenizer_extras(tokenizer),
                        summary=f"{manifest['tokens']:,} tokens{docs} ({tokenizer.kind} "
                                f"tokenizer), {len(train_ids):,} train / {len(val_ids):,} "
                                f"val{note}")

    def _open_prepared(self, source: str, kind: str | None) -> Prepared:
        """A DATA_DIR written by ``prepare``: its tokenizer and memory-mapped splits."""
        manifest, train_ids, val_ids = open_shards(source)
        tokenizer = load_tokenizer(Path(source) / "tokenizer.json")
        family = manifest.get("family", self.name)  # absent: prepared before it was recorded
        if family != self.name and tokenizer.kind != "char":  # characters: the same ids
            raise NotApplicable(f"{source} was prepared for --model {family} runs: its "
                                f"tokenizer and the tokens between its documents are theirs; "
                                f"train with --model {family}, or prepare the text again with "
                                f"--model {self.name}")
        if kind is not None and not tokenizer.kind.startswith(kind.split("-")[0]):
            raise NotApplicable(f"--tokenizer {kind}: {source} was prepared with a "
                                f"{tokenizer.kind} tokenizer (drop --tokenizer)")
        folder = str(Path(source).resolve())
        data_meta = {"source": folder, "encoding": "utf-8", "tokenizer": tokenizer.kind,
                     "prepared": True, "sources": manifest.get("sources", [])}
        return Prepared(folder, "utf-8", tokenizer, data_meta, train_ids, val_ids,
                        extra=self.tokenizer_extras(tokenizer),
                        summary=f"{manifest['tokens']:,} prepared tokens in "
                                f"{manifest['documents']:,} document(s) ({tokenizer.kind} "
                                f"tokenizer), {len(train_ids):,} train / {len(val_ids):,} val, "
                                f"memory-mapped")

    def prepare_dir(self, sources: list[str], out, kind: str | None, vocab: int | None,
                    **options) -> dict:
        """``minitransformer prepare`` for this family: its special tokens known up front, its
        separator between documents (see ``data/prepare.py`` for the options)."""
        prepare_corpus(sources, out, kind, vocab, special_tokens=self.special_tokens,
                       bpe_separator=self.separator(options.get("tokenizer")), **options)
        return record_family(out, self.name)  # train checks it (``_open_prepared``)

    def _encode(self, text: str, tokenizer, source: str | list[str], encoding: str,
                newline: str, crlf: int, text_field: str = "text") -> Prepared:
        ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)
        train_ids, val_ids = split_ids(ids)
        data_meta = {"source": source, "encoding": encoding, "tokenizer": tokenizer.kind,
                     "newline": newline, **with_field(text_field)}
        note = f"; {crlf:,} CRLF line ends read as \\n (--newline keep keeps them)" if crlf \
            else ""
        return Prepared(source, encoding, tokenizer, data_meta, train_ids, val_ids,
                        extra=self.tokenizer_extras(tokenizer),
                        summary=f"{len(ids):,} tokens ({tokenizer.kind} tokenizer), "
                                f"{len(train_ids):,} train / {len(val_ids):,} val{note}")

    def check_length(self, prepared: Prepared, block_size: int) -> None:
        check_length(prepared.train_ids, prepared.val_ids, block_size, prepared.source)

    def evaluation_task(self, model, tokenizer, meta: dict, options: dict):
        """(task, batch size, eval_iters, dtype, whole). On the corpus the run was trained on
        (however it is named now: the same files' contents), its val split, as the trainer
        measured it: the same batches, the same precision. On another text (evaluate --data),
        all of it (whole = True): a test file is there to be scored, not split; a prepared
        folder keeps the split it was prepared with."""
        source, encoding = data_source(meta, options)
        named = as_named_now(meta, source) if options.get("data") else meta
        try:
            prepared = self.reopen(named, tokenizer, source, encoding,
                                   text_field=options.get("text_field"))
        except UnknownCharactersError as e:
            raise UserError(f"{source}: {e}. A character model scores only text in its own "
                            f"alphabet; one trained with --tokenizer bpe-chars or bpe-bytes "
                            f"reads new characters") from None
        whole = not prepared.data_meta.get("prepared") and \
            not same_corpus(meta.get("data", {}), prepared.data_meta)
        if whole:
            ids = joined(prepared.train_ids, prepared.val_ids)
            if len(ids) < model.config.block_size + 1:
                raise UserError(f"{prepared.source} is {len(ids):,} tokens; scoring needs at "
                                f"least block_size + 1 = {model.config.block_size + 1}")
            prepared = dataclasses.replace(prepared, val_ids=ids)
        else:
            self.check_length(prepared, model.config.block_size)
        cfg = train_config(meta)
        task = self.make_task(prepared, model.config)
        device = next(model.parameters()).device
        return (task, options.get("batch_size") or cfg.batch_size,
                options.get("eval_iters") or cfg.eval_iters, pick_dtype(cfg.dtype, device),
                whole)

    def make_task(self, prepared: Prepared, config):
        raise NotImplementedError

    def val_loss(self, model, tokenizer, meta: dict, options: dict):
        """(loss, task, batch, iters, where): the trainer's measure, through its own function,
        and what it was measured on, as one line for ``evaluate`` (the corpus, the split or
        the whole text, the windows)."""
        task, batch, iters, dtype, whole = self.evaluation_task(model, tokenizer, meta,
                                                                options)
        device = next(model.parameters()).device
        seed = options.get("seed") or 0
        loss = estimate_loss(model, task, "val", batch, iters, device, dtype, seed)
        source, _ = data_source(meta, options)
        names = ", ".join(Path(s).name or s for s in (source if isinstance(source, list)
                                                       else [source]))
        scope = "all of" if whole else "the val split of"
        where = (f"{'measured on':<16}{scope} {names} ({len(task.data['val']):,} tokens), "
                 f"{iters} x {batch} windows of {model.config.block_size}, seed {seed}")
        return loss, task, batch, iters, where


def same_corpus(recorded: dict, data_meta: dict) -> bool:
    """Whether ``data_meta`` (a corpus read now) is the text a run recorded it was trained on,
    read from the same field: files of the same contents, wherever they are now (a corpus
    moved since; one changed under its own name is not), or, for a run that recorded no
    contents, the same source. A run trained on a prepared folder was split by it: only the
    folder is its own (the text it was prepared from, split 90/10 here, would mix its
    splits)."""
    if data_meta.get("text_field", "text") != recorded.get("text_field", "text"):
        return False
    if recorded.get("prepared"):
        return data_meta.get("source") == recorded.get("source")
    mine = [f.get("sha256") for f in recorded.get("sources", [])]
    now = [f.get("sha256") for f in data_meta.get("sources", [])]
    if mine and None not in mine and now:  # by contents: a file of its name may have changed
        return mine == now
    return data_meta.get("source") == recorded.get("source")  # a run from before fingerprints
