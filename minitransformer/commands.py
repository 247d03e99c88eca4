"""What each CLI subcommand does (argument parsing lives in cli.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import torch

from .config import GPTConfig, TrainConfig, config_from_dict, get_preset, split_fields
from .data import check_length, load_text, split_ids
from .errors import ConfigError, UserError
from .interop.cli import stream_text
from .models import GPT
from .tokenizers import fit_tokenizer, tokenizer_from_dict
from .training import checkpoint as ckpt
from .training.device import decoding_threads, pick_device
from .training.health import HealthGuard
from .training.trainer import LanguageModelTask, estimate_loss, train

DEFAULT_PRESET = "cpu-small"


def _build_configs(preset: dict, model_over: dict, train_over: dict, vocab_size: int):
    model_p, train_p = split_fields(preset, GPTConfig, TrainConfig)
    model_cfg = config_from_dict(GPTConfig, {**model_p, **model_over, "vocab_size": vocab_size})
    train_cfg = config_from_dict(TrainConfig, {**train_p, **train_over})
    return model_cfg, train_cfg


@dataclasses.dataclass
class Resume:
    """What ``--resume`` takes from a run's newest checkpoint."""

    meta: dict
    source: str
    encoding: str
    tokenizer: object
    model_cfg: object
    train_cfg: TrainConfig


def load_resume(out: Path, family: str, config_cls, model_over: dict, train_over: dict,
                args) -> Resume:
    """Read the newest checkpoint of ``out`` for ``--resume``: the model config is the run's
    own (repeating the original flags is fine, changing them is an error); training fields
    given on the command line (e.g. a larger --max_iters) override the saved ones."""
    found = ckpt.list_checkpoints(out)
    if not found:
        raise UserError(f"nothing to resume in {out}: it has no checkpoints/ folder")
    meta = ckpt.read_meta(found[-1])
    if meta.get("family", "gpt") != family:
        raise UserError(f"{out} holds a {meta.get('family')} run, not a {family} run")
    changed = [k for k, v in model_over.items() if meta["model"].get(k) != v]
    if changed:
        raise UserError(f"--resume keeps the run's model; {', '.join(changed)} differ(s) "
                        f"from the checkpoint")
    data = meta.get("data", {})
    try:
        tokenizer = tokenizer_from_dict(json.loads(
            (found[-1] / ckpt.TOKENIZER_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read the run's tokenizer: {e}") from None
    return Resume(meta, args.data or data.get("source"),
                  data.get("encoding", getattr(args, "encoding", "utf-8")), tokenizer,
                  config_from_dict(config_cls, meta["model"]),
                  config_from_dict(TrainConfig, {**meta["train"], **train_over}))


def cmd_train(args) -> int:
    if getattr(args, "model", "gpt") == "encoder":
        from .commands_encoder import cmd_train_encoder
        return cmd_train_encoder(args)
    from .commands_seq2seq import cmd_train_seq2seq, wants_seq2seq
    if wants_seq2seq(args):
        return cmd_train_seq2seq(args)
    from .cli import config_overrides

    model_over, train_over = config_overrides(args)
    out = Path(args.out)
    if args.resume:
        r = load_resume(out, "gpt", GPTConfig, model_over, train_over, args)
        source, encoding, tokenizer = r.source, r.encoding, r.tokenizer
        model_cfg, train_cfg = r.model_cfg, r.train_cfg
        text = load_text(source, encoding)
    else:
        source, encoding = args.data or "shakespeare", args.encoding
        preset = get_preset("gpt", args.preset or DEFAULT_PRESET)
        text = load_text(source, encoding)
        kind = getattr(args, "tokenizer", None) or "char"  # bpe: --vocab-size is its size
        tokenizer = fit_tokenizer(kind, text,
                                  model_over.pop("vocab_size", None) if kind == "bpe" else None)
        model_cfg, train_cfg = _build_configs(preset, model_over, train_over,
                                              tokenizer.vocab_size)
    ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    train_ids, val_ids = split_ids(ids)
    if not args.resume and args.preset is None and "time_budget" in train_over:
        from .experiments.autosize import autosize_for_train  # size the model to the budget
        preset = autosize_for_train(len(train_ids), len(val_ids), tokenizer.vocab_size,
                                    model_over, train_over, echo=print)
        model_cfg, train_cfg = _build_configs(preset, model_over, train_over,
                                              tokenizer.vocab_size)
    check_length(train_ids, val_ids, model_cfg.block_size, source)

    torch.manual_seed(train_cfg.seed)
    model = GPT(model_cfg)
    meta = {"format": "minitransformer", "version": 1, "family": "gpt",
            "model": dataclasses.asdict(model_cfg),
            "data": {"source": source, "encoding": encoding, "tokenizer": tokenizer.kind}}
    quiet = args.quiet
    if not quiet:
        print(f"corpus {source}: {len(ids):,} tokens ({tokenizer.vocab_size} distinct), "
              f"{len(train_ids):,} train / {len(val_ids):,} val")
        print(f"model: {model.num_params():,} parameters ({model_cfg.n_layer} layers, "
              f"{model_cfg.n_head} heads, {model_cfg.n_embd} wide, context "
              f"{model_cfg.block_size}); device {pick_device(train_cfg.device)}")
        budget = f"{train_cfg.time_budget:.0f}s" if train_cfg.time_budget else \
            f"{train_cfg.max_iters} steps"
        print(f"training for {budget}, batch {train_cfg.batch_size}, lr "
              f"{train_cfg.learning_rate:g}; run folder {out}")
    task = LanguageModelTask(train_ids, val_ids, model_cfg.block_size)
    health = HealthGuard(early_stop=getattr(args, "early_stop", False))
    result = train(model, tokenizer, task, train_cfg, out, meta, resume=args.resume,
                   force=args.force, progress=not quiet and sys.stderr.isatty() or None,
                   health=health)
    if result.interrupted:
        return 130
    print(f"done: {result.step} steps in {result.train_seconds:.0f}s of training; "
          f"val loss {result.val_loss:.4f} (best {result.best_val_loss:.4f})")
    print(f"best model: {out}/model.safetensors (+ config.json, tokenizer.json)")
    print(f"sample from it: minitransformer sample {out} --prompt 'ROMEO:'")
    return 0


def check_sampling_args(args) -> None:
    """The sampling flags every ``sample`` checks before loading anything heavy."""
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        raise UserError(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.temperature < 0 or not math.isfinite(args.temperature):
        raise UserError(f"--temperature must be >= 0, got {args.temperature}")
    if not args.prompt:
        raise UserError("--prompt is empty: give at least one character")


def cmd_sample(args) -> int:
    if getattr(args, "hf", None):
        from .interop.cli import cmd_sample_hf
        return cmd_sample_hf(args)
    if not args.dir:
        raise UserError("give a run folder to sample from (or --hf PATH)")
    device = pick_device(args.device)
    model, tokenizer, meta = ckpt.load_checkpoint_with_meta(args.dir, args.which, device)
    decoding_threads(model, device)
    if meta["family"] == "encoder":
        raise UserError(f"{args.dir} holds an encoder, which fills in masks rather than "
                        f"continuing text; try: minitransformer evaluate {args.dir}")
    check_sampling_args(args)
    idx = torch.tensor([tokenizer.encode(args.prompt)], dtype=torch.long, device=device)
    out = sys.stdout
    out.write(args.prompt)
    out.flush()
    tokens = model.stream(idx, args.max_new_tokens, args.temperature, args.top_k, args.top_p,
                          args.seed, use_cache=not args.no_cache)
    for piece in stream_text(tokens, tokenizer):  # whole characters, even from byte-level BPE
        out.write(piece)
        out.flush()
    out.write("\n")
    return 0


def cmd_evaluate(args) -> int:
    device = pick_device(args.device)
    model, tokenizer, meta = ckpt.load_checkpoint_with_meta(args.dir, args.which, device)
    if meta["family"] == "encoder":
        from .commands_encoder import evaluate_encoder
        return evaluate_encoder(args, model, tokenizer, meta)
    if meta["family"] == "seq2seq":
        from .commands_seq2seq import evaluate_bleu
        return evaluate_bleu(args, model, tokenizer, meta, device)
    data = meta.get("data", {})
    source = args.data or data.get("source")
    if not source:
        raise UserError("the checkpoint does not name its corpus; pass --data")
    text = load_text(source, args.encoding or data.get("encoding", "utf-8"))
    ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    train_ids, val_ids = split_ids(ids)
    check_length(train_ids, val_ids, model.config.block_size, source)
    try:
        batch = args.batch_size or TrainConfig(**meta.get("train", {})).batch_size
    except (TypeError, ConfigError):
        batch = 12
    task = LanguageModelTask(train_ids, val_ids, model.config.block_size)
    loss = estimate_loss(model, task, "val", batch, args.eval_iters, device, torch.float32,
                         args.seed)
    per = "character" if getattr(tokenizer, "kind", "") == "char" else "token"
    print(f"val loss      {loss:.4f} nats/{per}")
    print(f"perplexity    {math.exp(loss):.3f}")
    print(f"bits/{per:<8}{loss / math.log(2):.4f}")
    return 0
