"""``train --model encoder`` and ``evaluate`` of an encoder run: masked-LM training as BERT.

    minitransformer train --model encoder --data shakespeare --preset debug --out runs/mlm
    minitransformer evaluate runs/mlm      (val loss, masked-token accuracy, baseline)

The tokenizer gets one extra id, [MASK], beyond the corpus' own: with characters it is the
last id (the char tokenizer never produces it); with BPE it is the special token ``<mask>``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

from .commands import load_resume
from .config import EncoderConfig, TrainConfig, config_from_dict, field_names, get_preset
from .config import split_fields as split_config
from .data import check_length, load_text, split_ids
from .errors import UserError
from .models import FAMILIES, EncoderModel
from .tokenizers import TOKENIZERS, fit_tokenizer
from .training import checkpoint as ckpt
from .training.device import pick_device
from .training.health import HealthGuard
from .training.mlm import MaskedLMTask
from .training.trainer import estimate_loss, train

DEFAULT_PRESET = "cpu-small"
BPE_SPECIALS = ("<mask>",)


def add_train_flags(parser: argparse.ArgumentParser) -> None:
    """``train``'s --tokenizer and the EncoderConfig fields GPTConfig does not have."""
    parser.add_argument("--tokenizer", choices=TOKENIZERS, default=None,
                        help="char: one id per character (default); bpe: byte-level BPE "
                             "trained on the corpus, --vocab-size entries (default 1024)")
    g = parser.add_argument_group("encoder only (EncoderConfig, with --model encoder)")
    g.add_argument("--type_vocab_size", "--type-vocab-size", type=int, metavar="V",
                   default=argparse.SUPPRESS,
                   help="token-type (segment) embeddings, 0 = none (default 0)")
    g.add_argument("--embedding_norm", "--embedding-norm", choices=["layernorm", "none"],
                   default=argparse.SUPPRESS,
                   help="LayerNorm on the summed embeddings, as BERT (default layernorm)")
    g.add_argument("--mlm_head", "--mlm-head", choices=["bert", "linear"],
                   default=argparse.SUPPRESS,
                   help="masked-LM output: BERT's dense+GELU+LayerNorm transform, or a "
                        "plain linear layer (default bert)")


def _given_fields(args) -> tuple[dict, dict]:
    """The config fields given on the command line, split into (model, training); a field of
    another family's config is an error."""
    every = set(field_names(TrainConfig))
    for config_cls, _ in FAMILIES.values():
        every |= set(field_names(config_cls))
    given = {k: v for k, v in vars(args).items() if k in every}
    return tuple(split_config(given, EncoderConfig, TrainConfig))


def _mask_id(tokenizer) -> tuple[int, int]:
    """(mask id, model vocabulary size) for a fitted tokenizer."""
    if getattr(tokenizer, "kind", "") == "char":
        return tokenizer.vocab_size, tokenizer.vocab_size + 1  # one id past the characters
    mask = tokenizer.token_to_id("<mask>")
    if mask is None:
        raise UserError("the BPE tokenizer has no <mask> token")
    return mask, tokenizer.vocab_size


def cmd_train_encoder(args) -> int:
    model_over, train_over = _given_fields(args)
    out = Path(args.out)
    if args.resume:
        r = load_resume(out, "encoder", EncoderConfig, model_over, train_over, args)
        source, encoding, tokenizer = r.source, r.encoding, r.tokenizer
        model_cfg, train_cfg = r.model_cfg, r.train_cfg
        text = load_text(source, encoding)
        kind = r.meta.get("data", {}).get("tokenizer", "char")
    else:
        source, encoding = args.data or "shakespeare", args.encoding
        kind = getattr(args, "tokenizer", None) or "char"
        model_p, train_p = split_config(get_preset("encoder", args.preset or DEFAULT_PRESET),
                                        EncoderConfig, TrainConfig)
        text = load_text(source, encoding)
        tokenizer = fit_tokenizer(kind, text, model_over.pop("vocab_size", None), BPE_SPECIALS)
        mask_id, vocab = _mask_id(tokenizer)
        model_cfg = config_from_dict(EncoderConfig, {**model_p, **model_over,
                                                     "vocab_size": vocab, "mask_id": mask_id})
        train_cfg = config_from_dict(TrainConfig, {**train_p, **train_over})
    if model_cfg.mlm_head == "none":
        raise UserError("masked-LM training needs an output head: --mlm_head bert or linear")
    ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    train_ids, val_ids = split_ids(ids)
    check_length(train_ids, val_ids, model_cfg.block_size, source)

    torch.manual_seed(train_cfg.seed)
    model = EncoderModel(model_cfg)
    meta = {"format": "minitransformer", "version": 1, "family": "encoder",
            "model": dataclasses.asdict(model_cfg),
            "data": {"source": source, "encoding": encoding, "tokenizer": kind}}
    task = MaskedLMTask(train_ids, val_ids, model_cfg.block_size, model_cfg.mask_id,
                        model_cfg.vocab_size)
    if not args.quiet:
        print(f"corpus {source}: {len(ids):,} tokens ({kind} tokenizer, {model_cfg.vocab_size} "
              f"ids with [MASK]), {len(train_ids):,} train / {len(val_ids):,} val")
        print(f"encoder: {model.num_params():,} parameters ({model_cfg.n_layer} layers, "
              f"{model_cfg.n_head} heads, {model_cfg.n_embd} wide, context "
              f"{model_cfg.block_size}); masked-LM, 15% of tokens chosen (80/10/10)")
    result = train(model, tokenizer, task, train_cfg, out, meta, resume=args.resume,
                   force=args.force, progress=not args.quiet and sys.stderr.isatty() or None,
                   health=HealthGuard(early_stop=getattr(args, "early_stop", False)))
    if result.interrupted:
        return 130
    device = pick_device(train_cfg.device)
    best, _ = ckpt.load_checkpoint(out, "best", device)
    acc, base = task.accuracy(best, "val", train_cfg.batch_size, train_cfg.eval_iters, device)
    print(f"done: {result.step} steps in {result.train_seconds:.0f}s of training; "
          f"val loss {result.val_loss:.4f} (best {result.best_val_loss:.4f})")
    print(f"best model: val masked-token accuracy {acc:.1%} (always guessing the most "
          f"frequent token: {base:.1%})")
    print(f"evaluate it: minitransformer evaluate {out}")
    return 0


def evaluate_encoder(args, model, tokenizer, meta: dict) -> int:
    """``evaluate DIR`` for an encoder run: val loss, masked-token accuracy and baseline."""
    data = meta.get("data", {})
    source = args.data or data.get("source")
    if not source:
        raise UserError("the checkpoint does not name its corpus; pass --data")
    text = load_text(source, args.encoding or data.get("encoding", "utf-8"))
    ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    train_ids, val_ids = split_ids(ids)
    c = model.config
    check_length(train_ids, val_ids, c.block_size, source)
    batch = args.batch_size or meta.get("train", {}).get("batch_size", 12)
    task = MaskedLMTask(train_ids, val_ids, c.block_size, c.mask_id, c.vocab_size)
    device = next(model.parameters()).device
    loss = estimate_loss(model, task, "val", batch, args.eval_iters, device, torch.float32,
                         args.seed)
    acc, base = task.accuracy(model, "val", batch, args.eval_iters, device, args.seed)
    print(f"masked-LM val loss        {loss:.4f} nats/token")
    print(f"masked-token accuracy     {acc:.1%}")
    print(f"most-frequent baseline    {base:.1%}")
    return 0
