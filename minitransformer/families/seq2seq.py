"""The seq2seq family: the paper's encoder-decoder on sentence pairs, with one joint BPE.

    train      teacher forcing on length-bucketed batches, label-smoothed loss
    evaluate   val loss per target token, then BLEU (sacrebleu) greedy and with beam search
    translate  sentences, or the lines of a file
    attention  encoder self-, decoder self- and cross-attention
"""

from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm

from ..config import Seq2SeqConfig, config_from_dict
from ..data import ParallelDataConfig, encode_pairs, load_parallel, source_ids, split_indices
from ..data.cache import recorded_source
from ..data.text import BUNDLED
from ..models import Seq2SeqTransformer
from ..models.decoding import MAX_LENGTH_PENALTY, longest_output, translate_many
from ..presets import SEQ2SEQ as PRESETS
from ..tokenizers import BPETokenizer
from ..tokenizers.fitting import cjk_share, is_cjk
from ..training.device import pick_dtype
from ..training.seq2seq_task import Seq2SeqTask
from ..training.trainer import estimate_loss
from ..viz.views import seq2seq_views
from .base import (
    Built,
    Family,
    NotApplicable,
    Prepared,
    data_source,
    note_unknown_pieces,
    run_meta,
    summary_lines,
    train_config,
)

DECODING = frozenset({"beam", "length_penalty", "max_len"})


def refuse_text_field(text_field: str | None, source: str | list[str] | None = None) -> None:
    if isinstance(source, list):  # evaluate --data A B
        raise NotApplicable("sentence pairs come from one --data (a TSV, or with --data_tgt)")
    if text_field is not None:
        raise NotApplicable(f"--text_field {text_field}: sentence pairs are read by column "
                            f"(--src and --tgt name them), not from one text field")


class Seq2SeqFamily(Family):
    name = "seq2seq"
    presets = PRESETS
    title = "encoder-decoder"
    a_title = "an encoder-decoder"
    config_class = Seq2SeqConfig
    model_class = Seq2SeqTransformer
    data_classes = (ParallelDataConfig,)
    default_data = "bible_en_es"
    tokenizers = ("bpe",)
    commands = frozenset({"translate"})
    init_changeable = Family.init_changeable | {"label_smoothing"}  # the loss, not the model
    redirects = {"sample": "it translates: minitransformer translate DIR \"a sentence\"",
                 "fill": "it translates: minitransformer translate DIR \"a sentence\"",
                 "explain": "its attention maps: minitransformer attention DIR --text ...",
                 "export": "export writes GPT runs (as GPT-2, Llama or Qwen3 folders); an "
                           "encoder-decoder run loads in Python: "
                           "minitransformer.load_checkpoint(DIR)"}
    evaluate_options = frozenset({"data", "encoding", "eval_iters", "batch_size", "seed",
                                  "split", "limit", "examples", "bleu_tokenize", "src",
                                  "tgt", "data_tgt"}) | DECODING

    def claims(self, source: str | None, source_tgt: str | None) -> bool:
        """Sentence pairs imply this family: two aligned files, or a .tsv corpus."""
        if not isinstance(source, (str, type(None))):
            return False  # several --data: token streams
        return bool(source_tgt) or BUNDLED.get(source or "", source or "").endswith(".tsv")

    def _data_config(self, fields: dict) -> ParallelDataConfig:
        names = {f for f in fields if f in ParallelDataConfig.__dataclass_fields__}
        return config_from_dict(ParallelDataConfig, {k: fields[k] for k in names})

    def saved_fields(self, meta: dict) -> dict:
        return {**meta["model"], **meta.get("data", {}).get("config", {})}

    def prepare(self, source: str, encoding: str, fields: dict, kind: str | None,
                source_tgt: str | None = None, newline: str | None = None,
                text_field: str | None = None) -> Prepared:
        refuse_text_field(text_field)
        if not isinstance(source, str):
            raise NotApplicable("the encoder-decoder reads one parallel corpus: give --data "
                                "once (and --data_tgt for two aligned files)")
        if newline == "keep":
            raise NotApplicable("--newline keep does not apply to sentence pairs: they are "
                                "read one per line")
        if kind not in (None, "bpe"):
            raise NotApplicable(f"--tokenizer {kind}: the encoder-decoder uses one joint BPE "
                                f"vocabulary (--vocab_size sets its size)")
        data_cfg = self._data_config(fields)
        corpus = load_parallel(source, source_tgt, data_cfg.src, data_cfg.tgt, encoding)
        splits = split_indices(corpus.groups)
        texts = [side[i] for side in (corpus.src, corpus.tgt) for i in splits["train"]]
        tokenizer = BPETokenizer.train(texts, fields.get("vocab_size", 8000))
        return self._prepared(corpus, splits, tokenizer, source, source_tgt, encoding, data_cfg)

    def reopen(self, meta: dict, tokenizer, source: str, encoding: str,
               source_tgt: str | None = None, newline: str | None = None,
               text_field: str | None = None, columns: dict | None = None,
               whole: bool | None = False) -> Prepared:
        """The run's corpus (or ``source``) read again; ``columns``: {"src": ..., "tgt": ...}
        to read instead of the columns the run was trained on (evaluate --src / --tgt);
        ``whole``: every pair in every split (a test set), not split 94/3/3; None: so when
        the pairs are not the run's own (``own_pairs``)."""
        refuse_text_field(text_field, source)
        data = meta.get("data", {})
        data_cfg = self._data_config({**data.get("config", {}), **(columns or {})})
        if source_tgt is None and data.get("source") is not None and \
                recorded_source([source]) == recorded_source([data["source"]]):
            source_tgt = data.get("source_tgt")
        corpus = load_parallel(source, source_tgt, data_cfg.src, data_cfg.tgt, encoding)
        if whole is None:
            whole = not own_pairs(data, corpus, source)
        every = list(range(len(corpus)))
        splits = dict.fromkeys(("train", "valid", "test"), every) if whole else \
            split_indices(corpus.groups)
        prepared = self._prepared(corpus, splits, tokenizer, source, source_tgt, encoding,
                                  data_cfg)
        prepared.extra["whole"] = whole
        return prepared

    def _prepared(self, corpus, splits, tokenizer, source, source_tgt, encoding,
                  data_cfg) -> Prepared:
        data_meta = {"source": source, "source_tgt": source_tgt, "encoding": encoding,
                     "pairs_sha256": corpus.digest(),
                     "tokenizer": "bpe", "src_lang": corpus.src_lang,
                     "tgt_lang": corpus.tgt_lang, "config": vars(data_cfg).copy(),
                     "pairs": {k: len(v) for k, v in splits.items()}}
        return Prepared(source, encoding, tokenizer, data_meta,
                        extra={"corpus": corpus, "splits": splits},
                        summary=f"{len(corpus):,} pairs {corpus.src_lang} -> "
                                f"{corpus.tgt_lang}, {len(splits['train']):,} train, "
                                f"{len(splits['valid']):,} valid, {len(splits['test']):,} "
                                f"test")

    def build(self, prepared: Prepared, fields: dict, seed: int = 0) -> Built:
        tok = prepared.tokenizer
        data_cfg = self._data_config(fields)
        model_fields = {k: v for k, v in fields.items()
                        if k not in ParallelDataConfig.__dataclass_fields__}
        cfg = config_from_dict(Seq2SeqConfig, {
            **model_fields, "vocab_size": tok.vocab_size, "pad_id": tok.pad_id,
            "bos_id": tok.bos_id, "eos_id": tok.eos_id})
        encoded, dropped = encode_splits(tok, prepared, cfg, data_cfg)
        task = Seq2SeqTask(encoded, cfg.pad_id, cfg.bos_id, cfg.eos_id, data_cfg.batch_tokens,
                           sample_sources(prepared, tok), seed=seed)
        meta = run_meta(self.name, cfg, {**prepared.data_meta,
                                         "config": vars(data_cfg).copy()})
        prepared.extra.update(dropped=dropped, kept=len(encoded["train"][0]))
        return Built(cfg, Seq2SeqTransformer(cfg), task, meta,
                     cfg.encoder_layers + cfg.decoder_layers)

    def describe(self, prepared: Prepared, built: Built, train_cfg) -> list[str]:
        c, d = built.config, prepared.data_meta["config"]
        src, tgt = built.task.splits["train"]
        longest = max(max(len(a), len(b) + 1) for a, b in zip(src, tgt, strict=True))
        alone = f" (a pair longer, up to {longest}, alone)" if longest > d["batch_tokens"] else ""
        (n, limit), (n_valid, valid_limit) = prepared.extra["dropped"].values()  # train, valid
        lines = summary_lines(
            f"corpus {prepared.extra['corpus'].name}: {prepared.summary}; {n:,} training pairs "
            f"longer than {limit} tokens dropped, {prepared.extra['kept']:,} kept" + (
                f"; {n_valid:,} valid pairs longer than {valid_limit} left out" if n_valid else
                ""), "model", built,
            f"{c.encoder_layers}+{c.decoder_layers} layers, {c.n_head} heads, {c.n_embd} wide, "
            f"d_ff {c.ffn_width}", train_cfg,
            f"batches of <= {train_cfg.batch_size} pairs and <= {d['batch_tokens']} tokens"
            + alone)
        vocabulary = f"joint BPE vocabulary: {prepared.tokenizer.vocab_size:,} tokens"
        return [lines[0], vocabulary, *lines[1:]]

    def finish(self, run_dir, result, prepared: Prepared, built: Built, train_cfg) -> list[str]:
        return [f"translate with: minitransformer translate {run_dir} \"your sentence\"",
                f"BLEU on the test split: minitransformer evaluate {run_dir}"]

    def attention_views(self, model, tokenizer, text: str, target: str | None = None):
        return seq2seq_views(model, tokenizer, text, target)

    def evaluate(self, model, tokenizer, meta: dict, options: dict, device) -> list[str]:
        """Val loss as training measured it, then BLEU on a split (greedy and beam)."""
        opts = decoding_options(options, model)
        source, encoding = data_source(meta, options)
        columns = {k: options[k] for k in ("src", "tgt") if k in options}
        if columns and "data" not in options:
            raise NotApplicable(f"--{next(iter(columns))} names a column of --data; without "
                                f"it the run's own corpus is read as in training")
        if "data_tgt" in options and "data" not in options:
            raise NotApplicable("--data_tgt is the target file beside --data (the source "
                                "file); give both")
        # another corpus is a test set: all of it (the run's own, however named: its split)
        prepared = self.reopen(meta, tokenizer, source, encoding, options.get("data_tgt"),
                               columns=columns, whole=False if options.get("split") else None)
        split, corpus = options.get("split") or "test", prepared.extra["corpus"]
        where = "valid split, as in training" if own_pairs(meta.get("data", {}), corpus, source) \
            else f"the valid split of {corpus.name}"  # --split: another corpus split as the run's
        fields = self.saved_fields(meta)
        if prepared.extra["whole"]:
            split = "all"
            where = f"batches drawn from all {len(prepared.extra['corpus']):,} pairs"
            fields["train_max_len"] = fields.get("block_size", 1 << 30)  # no training here
        cfg = train_config(meta)
        built_task = self.build(prepared, fields, cfg.seed).task
        loss = estimate_loss(model, built_task, "val", options.get("batch_size")
                             or cfg.batch_size, options.get("eval_iters") or cfg.eval_iters,
                             device, pick_dtype(cfg.dtype, device), options.get("seed") or 0)
        lines = [f"val loss {loss:.4f} nats/target token ({where})"]
        return lines + bleu_lines(model, tokenizer, prepared, split,
                                  options.get("limit"), options.get("examples", 3), opts,
                                  device, options.get("bleu_tokenize"))

    def translate(self, model, tokenizer, lines: list[str], options: dict, device) -> list[str]:
        """One translation per line (empty lines stay empty)."""
        opts = decoding_options(options, model)
        todo = [i for i, line in enumerate(lines) if line.strip()]
        sources = encode_sources(model, tokenizer, lines)  # a note names the line's number
        outs = translate_many(model, [sources[i] for i in todo],
                              opts["beam"], opts["max_len"], opts["length_penalty"],
                              options.get("batch_size") or 32, device,
                              min_len=opts["min_len"])
        result = [""] * len(lines)
        for i, ids in zip(todo, outs, strict=True):
            result[i] = tokenizer.decode(ids)
        return result


def decoding_options(options: dict, model=None) -> dict:
    """Beam size, GNMT length penalty, the longest and the shortest output, checked (against
    the longest output ``model``'s positions allow, when it is given)."""
    beam = 4 if options.get("beam") is None else options["beam"]
    penalty = 0.6 if options.get("length_penalty") is None else options["length_penalty"]
    max_len = options.get("max_len")
    if beam < 1:
        raise NotApplicable(f"--beam must be at least 1, got {beam}")
    if beam == 1 and options.get("length_penalty") is not None:
        raise NotApplicable("--length_penalty applies to beam search; --beam 1 is greedy")
    if not 0 <= penalty <= MAX_LENGTH_PENALTY:  # also refuses nan and inf
        raise NotApplicable(f"--length_penalty must be from 0 to {MAX_LENGTH_PENALTY:g}, "
                            f"got {penalty}")
    if max_len is not None and max_len < 1:
        raise NotApplicable(f"--max_len must be at least 1, got {max_len}")
    min_len = options.get("min_len") or 0
    if min_len < 0 or (max_len is not None and min_len > max_len):
        raise NotApplicable(f"--min_len must be in 0 .. --max_len, got {min_len}")
    limit = None if model is None else longest_output(model)
    for flag, value in (("max_len", max_len), ("min_len", min_len)):
        if limit is not None and value is not None and value > limit:
            raise NotApplicable(f"--{flag} must be at most {limit}, the longest translation "
                                f"this model's learned positions allow, got {value}")
    return {"beam": beam, "length_penalty": penalty, "max_len": max_len, "min_len": min_len}


def encode_splits(tokenizer, prepared: Prepared, model_cfg: Seq2SeqConfig,
                  data_cfg: ParallelDataConfig):
    """Token ids of train and valid, and per split (pairs left out, the limit): pairs longer
    than block_size - 1 tokens, and training pairs longer than train_max_len."""
    corpus, splits = prepared.extra["corpus"], prepared.extra["splits"]
    out, dropped = {}, {}
    for name in ("train", "valid"):
        idx = splits[name]
        src, tgt = encode_pairs(tokenizer, [corpus.src[i] for i in idx],
                                [corpus.tgt[i] for i in idx], model_cfg.eos_id)
        limit = model_cfg.block_size - 1
        if name == "train":
            limit = min(limit, data_cfg.train_max_len)
        keep = [i for i in range(len(src)) if len(src[i]) <= limit + 1 and len(tgt[i]) <= limit]
        dropped[name] = (len(src) - len(keep), limit)
        out[name] = ([src[i] for i in keep], [tgt[i] for i in keep])
        if not keep:
            most = {"--block_size": model_cfg.block_size - 1,
                    "--train_max_len": data_cfg.train_max_len if name == "train" else -1}
            raise NotApplicable(f"every {name} pair is longer than {limit} tokens; raise "
                                f"{' and '.join(f for f, n in most.items() if n == limit)}")
    return out, dropped


def own_pairs(recorded: dict, corpus, source: str) -> bool:
    """Whether ``corpus`` (read from ``source``) is the run's own: the pairs it recorded
    (a moved, copied or renamed file too), or, for runs that recorded none, its name."""
    if "pairs_sha256" in recorded:
        return recorded["pairs_sha256"] == corpus.digest()
    own = recorded.get("source")
    return own is not None and recorded_source([source]) == recorded_source([own])


def sample_sources(prepared: Prepared, tokenizer, n: int = 2) -> list[str]:
    """A few short validation sentences to translate at each evaluation."""
    corpus, valid = prepared.extra["corpus"], prepared.extra["splits"]["valid"]
    picked = [corpus.src[i] for i in valid if 6 <= len(tokenizer.encode(corpus.src[i])) <= 24]
    return picked[:n] or [corpus.src[valid[0]]]


def encode_sources(model, tokenizer, texts: list[str], what: str = "sentence"
                   ) -> list[list[int]]:
    """Source ids ending in </s>, cut to the position table when it cannot extend; that cut
    (the translation is then of the beginning) and pieces read as <unk> are said on stderr."""
    note_unknown_pieces(tokenizer, texts)
    c = model.config
    limit = c.block_size - 1 if c.pos_encoding == "learned" else None
    if limit is not None:
        long = [(i, n) for i, n in enumerate(map(len, tokenizer.encode_batch(texts)))
                if n > limit]
        if len(long) == 1:
            print(f"note: {what} {long[0][0] + 1} is {long[0][1]} tokens; it is translated "
                  f"from its first {limit} (the model's learned positions end there)",
                  file=sys.stderr)
        elif long:
            print(f"note: {len(long)} {what}s are longer than {limit} tokens; each is "
                  f"translated from its first {limit} (the model's learned positions end "
                  f"there)", file=sys.stderr)
    return source_ids(tokenizer, texts, c.eos_id, limit)


BLEU_TOKENIZERS = ("auto", "13a", "zh", "char", "intl", "none", "ja-mecab", "ko-mecab")


def bleu_tokenizer(refs: list[str], choice: str | None = None) -> tuple[str, str]:
    """(sacreBLEU tokenizer, why) for references ``refs``.

    BLEU counts word n-grams, and sacreBLEU's default ``13a`` finds words by spaces, so a
    Chinese sentence is one "word" and a perfect translation can score 0. ``auto`` takes
    ``zh`` (each Chinese character a word, runs of other text cut as 13a does) when the
    references are mostly CJK, ``char`` for Japanese with kana when MeCab is not installed.
    """
    if choice not in (None, "auto"):
        return choice, "as --bleu_tokenize asked"
    text = "".join(refs[:2000])
    share = cjk_share(text)
    if share <= 0.5:
        return "13a", "sacreBLEU's default; --bleu_tokenize zh for Chinese targets"
    kana = sum(0x3040 <= ord(ch) <= 0x30FF for ch in text)
    if kana > 0.1 * sum(map(is_cjk, text)):
        try:
            import MeCab  # noqa: F401 - sacrebleu[ja]
            return "ja-mecab", f"the references are {share:.0%} CJK, with kana: Japanese"
        except ImportError:
            return "char", (f"the references are {share:.0%} CJK, with kana: Japanese, and "
                            f"MeCab is not installed (pip install sacrebleu[ja] for ja-mecab)")
    return "zh", f"the references are {share:.0%} CJK: each Chinese character counts as a word"


def bleu_lines(model, tokenizer, prepared: Prepared, split: str, limit: int | None,
               examples: int, opts: dict, device, tokenize: str | None = None) -> list[str]:
    """BLEU (sacrebleu) on a split, greedy and with the beam; ``tokenize`` as in
    ``bleu_tokenizer`` (13a, or zh when the references are mostly Chinese)."""
    from sacrebleu.metrics import BLEU

    corpus = prepared.extra["corpus"]
    idx = prepared.extra["splits"]["test" if split == "all" else split][:limit or None]
    if not idx:
        raise NotApplicable(f"the {split} split of {prepared.source} is empty")
    refs = [corpus.tgt[i] for i in idx]
    sources = encode_sources(model, tokenizer, [corpus.src[i] for i in idx], "test source")
    scheme, why = bleu_tokenizer(refs, tokenize)
    which = f"{len(idx):,} {split}"
    if split == "all":
        which = f"all {len(idx):,}" if len(idx) == len(corpus) else \
            f"the first {len(idx):,} of {len(corpus):,}"
    lines = [f"{prepared.source}: {which} pairs {corpus.src_lang} -> {corpus.tgt_lang}",
             f"BLEU tokenizer {scheme}: {why}"]
    try:
        bleu = BLEU(tokenize=scheme)
    except RuntimeError as e:  # ja-mecab / ko-mecab without their packages
        raise NotApplicable(f"--bleu_tokenize {scheme}: {str(e).strip().splitlines()[0]}") \
            from None
    for beam in dict.fromkeys([1, opts["beam"]]):
        name = "greedy" if beam == 1 else f"beam {beam}"
        t0 = time.perf_counter()
        with tqdm(total=len(sources), desc=name, unit="sent", leave=False,
                  disable=not sys.stderr.isatty() or None) as bar:
            outs = translate_many(model, sources, beam, opts["max_len"], opts["length_penalty"],
                                  64, device, progress=bar.update)
        hyps = [tokenizer.decode(o) for o in outs]
        score = bleu.corpus_score(hyps, [refs])
        lp = f", length penalty {opts['length_penalty']:g}" if beam > 1 else ""
        lines.append(f"{name:<8} BLEU {score.score:5.2f}   ({score}{lp}; "
                     f"{time.perf_counter() - t0:.0f}s)")
    lines.append(f"sacrebleu signature: {bleu.get_signature()}")
    for i in range(min(examples, len(idx))):
        lines.append(f"\nsource:    {corpus.src[idx[i]]}\nreference: {refs[i]}\n"
                     f"model:     {hyps[i]}")
    return lines


FAMILY = Seq2SeqFamily()
