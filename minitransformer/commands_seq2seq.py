"""What ``train --model seq2seq``, ``translate`` and ``evaluate`` do for an encoder-decoder.

    minitransformer train --model seq2seq --data bible_en_es --preset cpu-small --out runs/mt
    minitransformer translate runs/mt "In the beginning God created the heavens and the earth."
    minitransformer evaluate runs/mt          (BLEU on the test split, greedy and beam)
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .config import Seq2SeqConfig, TrainConfig, config_from_dict, field_names, get_preset
from .config import split_fields as split_config
from .data import BUNDLED, ParallelDataConfig, encode_pairs, load_parallel, split_indices
from .errors import UserError
from .models import FAMILIES, Seq2SeqTransformer
from .models.decoding import translate_many
from .tokenizers import BPETokenizer, tokenizer_from_dict
from .training import checkpoint as ckpt
from .training.device import pick_device
from .training.health import HealthGuard
from .training.seq2seq_task import Seq2SeqTask
from .training.trainer import train

DEFAULT_PRESET = "cpu-small"
DEFAULT_DATA = "bible_en_es"


def wants_seq2seq(args) -> bool:
    """``train`` dispatch: --model seq2seq, two files, a .tsv corpus, or resuming such a run."""
    model = getattr(args, "model", "gpt")
    if model == "seq2seq" or getattr(args, "data_tgt", None):
        return True
    if model != "gpt":
        return False
    if getattr(args, "resume", False):
        found = ckpt.list_checkpoints(Path(args.out))
        if not found:
            return False
        try:
            return ckpt.read_meta(found[-1]).get("family") == "seq2seq"
        except UserError:
            return False
    data = getattr(args, "data", None) or ""
    return BUNDLED.get(data, data).lower().endswith(".tsv")


def _given_fields(args) -> tuple[dict, dict, dict]:
    """The config fields given on the command line: (model, training, data); a field of
    another family's config is an error."""
    every = set(field_names(TrainConfig)) | set(field_names(ParallelDataConfig))
    for config_cls, _ in FAMILIES.values():
        every |= set(field_names(config_cls))
    given = {k: v for k, v in vars(args).items() if k in every}
    return tuple(split_config(given, Seq2SeqConfig, TrainConfig, ParallelDataConfig))


def _encode_splits(tokenizer, corpus, splits, model_cfg: Seq2SeqConfig,
                   data_cfg: ParallelDataConfig):
    """Token ids of train and valid; training pairs longer than train_max_len are dropped."""
    out, dropped = {}, 0
    for name in ("train", "valid"):
        idx = splits[name]
        src, tgt = encode_pairs(tokenizer, [corpus.src[i] for i in idx],
                                [corpus.tgt[i] for i in idx], model_cfg.eos_id)
        limit = model_cfg.block_size - 1
        if name == "train":
            limit = min(limit, data_cfg.train_max_len)
        keep = [i for i in range(len(src)) if len(src[i]) <= limit + 1 and len(tgt[i]) <= limit]
        if name == "train":
            dropped = len(src) - len(keep)
        out[name] = ([src[i] for i in keep], [tgt[i] for i in keep])
        if not keep:
            raise UserError(f"every {name} pair is longer than {limit} tokens; raise "
                            f"--train_max_len or --block_size")
    return out, dropped


def _sample_sources(corpus, splits, tokenizer, n: int = 2) -> list[str]:
    """A few short validation sentences to translate at each evaluation."""
    picked = [corpus.src[i] for i in splits["valid"]
              if 6 <= len(tokenizer.encode(corpus.src[i])) <= 24]
    return picked[:n] or [corpus.src[splits["valid"][0]]]


def cmd_train_seq2seq(args) -> int:
    model_over, train_over, data_over = _given_fields(args)
    out = Path(args.out)
    if args.resume:
        found = ckpt.list_checkpoints(out)
        if not found:
            raise UserError(f"nothing to resume in {out}: it has no checkpoints/ folder")
        meta = ckpt.read_meta(found[-1])
        if model_over or data_over:
            raise UserError(f"--resume keeps the run's model and data; drop "
                            f"{', '.join([*model_over, *data_over])}")
        data = meta.get("data", {})
        source = args.data or data.get("source")
        source_tgt = getattr(args, "data_tgt", None) or data.get("source_tgt")
        encoding = data.get("encoding", args.encoding)
        data_cfg = config_from_dict(ParallelDataConfig, data.get("config", {}))
        tokenizer = tokenizer_from_dict(
            json.loads((found[-1] / ckpt.TOKENIZER_FILE).read_text(encoding="utf-8")))
        model_cfg = config_from_dict(Seq2SeqConfig, meta["model"])
        train_cfg = config_from_dict(TrainConfig, {**meta["train"], **train_over})
        corpus = load_parallel(source, source_tgt, data_cfg.src, data_cfg.tgt, encoding)
        splits = split_indices(corpus.groups)
    else:
        source = args.data or DEFAULT_DATA
        source_tgt, encoding = getattr(args, "data_tgt", None), args.encoding
        preset = get_preset("seq2seq", args.preset or DEFAULT_PRESET)
        model_p, train_p, data_p = split_config(preset, Seq2SeqConfig, TrainConfig,
                                                ParallelDataConfig)
        model_p = {**model_p, **model_over}
        config_from_dict(Seq2SeqConfig, model_p)  # bad values fail before the slow part
        train_cfg = config_from_dict(TrainConfig, {**train_p, **train_over})
        data_cfg = config_from_dict(ParallelDataConfig, {**data_p, **data_over})
        corpus = load_parallel(source, source_tgt, data_cfg.src, data_cfg.tgt, encoding)
        splits = split_indices(corpus.groups)
        train_texts = [corpus.src[i] for i in splits["train"]] + \
            [corpus.tgt[i] for i in splits["train"]]
        tokenizer = BPETokenizer.train(train_texts, model_p.get("vocab_size", 8000))
        model_cfg = config_from_dict(Seq2SeqConfig, {
            **model_p, "vocab_size": tokenizer.vocab_size, "pad_id": tokenizer.pad_id,
            "bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id})
    encoded, dropped = _encode_splits(tokenizer, corpus, splits, model_cfg, data_cfg)
    task = Seq2SeqTask(encoded, model_cfg.pad_id, model_cfg.bos_id, model_cfg.eos_id,
                       data_cfg.batch_tokens, _sample_sources(corpus, splits, tokenizer),
                       seed=train_cfg.seed)

    torch.manual_seed(train_cfg.seed)
    model = Seq2SeqTransformer(model_cfg)
    meta = {"format": "minitransformer", "version": 1, "family": "seq2seq",
            "model": dataclasses.asdict(model_cfg),
            "data": {"source": source, "source_tgt": source_tgt, "encoding": encoding,
                     "tokenizer": "bpe", "src_lang": corpus.src_lang,
                     "tgt_lang": corpus.tgt_lang, "config": dataclasses.asdict(data_cfg),
                     "pairs": {k: len(v) for k, v in splits.items()}}}
    if not args.quiet:
        n_train = len(encoded["train"][0])
        print(f"corpus {corpus.name}: {len(corpus):,} pairs {corpus.src_lang} -> "
              f"{corpus.tgt_lang}; {len(splits['train']):,} train ({dropped:,} longer than "
              f"{data_cfg.train_max_len} tokens dropped, {n_train:,} kept), "
              f"{len(splits['valid']):,} valid, {len(splits['test']):,} test")
        print(f"joint BPE vocabulary: {tokenizer.vocab_size:,} tokens")
        print(f"model: {model.num_params():,} parameters ({model_cfg.encoder_layers}+"
              f"{model_cfg.decoder_layers} layers, {model_cfg.n_head} heads, "
              f"{model_cfg.n_embd} wide, d_ff {model_cfg.ffn_width}); device "
              f"{pick_device(train_cfg.device)}")
        budget = f"{train_cfg.time_budget:.0f}s" if train_cfg.time_budget else \
            f"{train_cfg.max_iters} steps"
        lr = "noam" if train_cfg.lr_schedule == "noam" else f"{train_cfg.learning_rate:g}"
        print(f"training for {budget}, batches of <= {train_cfg.batch_size} pairs and "
              f"<= {data_cfg.batch_tokens} tokens, lr {lr}; run folder {out}")
    result = train(model, tokenizer, task, train_cfg, out, meta, resume=args.resume,
                   force=args.force, progress=not args.quiet and sys.stderr.isatty() or None,
                   health=HealthGuard(early_stop=getattr(args, "early_stop", False)))
    if result.interrupted:
        return 130
    print(f"done: {result.step} steps in {result.train_seconds:.0f}s of training; "
          f"val loss {result.val_loss:.4f} (best {result.best_val_loss:.4f})")
    print(f"translate with: minitransformer translate {out} \"your sentence\"")
    print(f"BLEU on the test split: minitransformer evaluate {out}")
    return 0


def _load_seq2seq(args, device):
    model, tokenizer, meta = ckpt.load_checkpoint_with_meta(args.dir, args.which, device)
    if meta["family"] != "seq2seq":
        raise UserError(f"{args.dir} holds a {meta['family']} model; translate needs an "
                        f"encoder-decoder (train --model seq2seq)")
    return model, tokenizer, meta


def _encode_sources(model, tokenizer, texts: list[str]) -> list[list[int]]:
    c = model.config
    limit = c.block_size - 1 if c.pos_encoding == "learned" else None
    return [(ids[:limit] if limit else ids) + [c.eos_id]
            for ids in tokenizer.encode_batch(texts)]


def _check_decoding_flags(args) -> None:
    if args.beam < 1:
        raise UserError(f"--beam must be at least 1, got {args.beam}")
    if args.length_penalty < 0:
        raise UserError(f"--length-penalty must be >= 0, got {args.length_penalty}")
    if args.max_len is not None and args.max_len < 1:
        raise UserError(f"--max-len must be at least 1, got {args.max_len}")


def cmd_translate(args) -> int:
    _check_decoding_flags(args)
    device = pick_device(args.device)
    model, tokenizer, _ = _load_seq2seq(args, device)
    if args.input is not None:
        if args.text:
            raise UserError("give the text or --input FILE, not both")
        if args.input == "-":
            lines = sys.stdin.read().splitlines()
        else:
            try:
                lines = Path(args.input).read_text(encoding=args.encoding).splitlines()
            except OSError as e:
                raise UserError(f"cannot read {args.input}: {e.strerror}") from None
            except UnicodeDecodeError:
                raise UserError(f"{args.input} is not valid {args.encoding}; pass "
                                f"--encoding") from None
    elif args.text:
        lines = list(args.text)
    else:
        raise UserError("nothing to translate: give a sentence or --input FILE")
    todo = [i for i, line in enumerate(lines) if line.strip()]
    outs = translate_many(model, _encode_sources(model, tokenizer, [lines[i] for i in todo]),
                          args.beam, args.max_len, args.length_penalty,
                          args.batch_size or 32, device)
    result = [""] * len(lines)
    for i, ids in zip(todo, outs, strict=True):
        result[i] = tokenizer.decode(ids)
    for line in result:
        print(line)
    return 0


def evaluate_bleu(args, model, tokenizer, meta, device) -> int:
    """``evaluate`` of a seq2seq run: BLEU (sacrebleu, default 13a tokenisation) on a split."""
    from sacrebleu.metrics import BLEU

    _check_decoding_flags(args)
    data = meta.get("data", {})
    cfg = config_from_dict(ParallelDataConfig, data.get("config", {}))
    source = args.data or data.get("source")
    if not source:
        raise UserError("the checkpoint does not name its corpus; pass --data")
    corpus = load_parallel(source, data.get("source_tgt") if not args.data else None,
                           cfg.src, cfg.tgt, args.encoding or data.get("encoding", "utf-8"))
    idx = split_indices(corpus.groups)[args.split]
    if args.limit:
        idx = idx[:args.limit]
    if not idx:
        raise UserError(f"the {args.split} split of {source} is empty")
    refs = [corpus.tgt[i] for i in idx]
    sources = _encode_sources(model, tokenizer, [corpus.src[i] for i in idx])
    print(f"{source}: {len(idx):,} {args.split} pairs {corpus.src_lang} -> {corpus.tgt_lang}")
    bleu = BLEU()
    for beam in dict.fromkeys([1, args.beam]):
        name = "greedy" if beam == 1 else f"beam {beam}"
        t0 = time.perf_counter()
        with tqdm(total=len(sources), desc=name, unit="sent", leave=False,
                  disable=not sys.stderr.isatty() or None) as bar:
            outs = translate_many(model, sources, beam, args.max_len, args.length_penalty,
                                  args.batch_size or 64, device, progress=bar.update)
        hyps = [tokenizer.decode(o) for o in outs]
        score = bleu.corpus_score(hyps, [refs])
        lp = f", length penalty {args.length_penalty:g}" if beam > 1 else ""
        print(f"{name:<8} BLEU {score.score:5.2f}   ({score}{lp}; "
              f"{time.perf_counter() - t0:.0f}s)")
    print(f"sacrebleu signature: {bleu.get_signature()}")
    for i in range(min(args.examples, len(idx))):
        print(f"\nsource:    {corpus.src[idx[i]]}\nreference: {refs[i]}\nmodel:     {hyps[i]}")
    return 0
