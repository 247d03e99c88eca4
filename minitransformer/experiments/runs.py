"""One training run for any family: new or resumed, from a request to a run folder.

    new run   settings = preset + the fields given; read the corpus, fit the tokenizer (the
              family's ``prepare``), size the model to a time budget where the family can,
              build model and task, print the family's summary, train
    resume    the newest checkpoint names its family, model, data and tokenizer; the same
              fields may be repeated, a different model or data field is an error, training
              fields given (e.g. a larger --max_iters) override the saved ones
    init_from a pretrained folder (Hugging Face GPT-2, Llama, Qwen3, BERT, or a run) gives
              the model, its weights and the tokenizer; the training fields come from
              --preset (default finetune); flags that would change the architecture are
              errors

Nothing here knows a family by name: everything family-specific is a method of ``Family``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import TrainConfig, config_from_dict, field_names
from ..data.shards import is_prepared
from ..data.text import BUNDLED, check_encoding_applies, same_encoding
from ..errors import ConfigError, UserError
from ..families import FAMILIES, Family, choose_family, family_of, load_checkpoint
from ..families.base import as_named_now, train_config
from ..families.pretrained import read_source
from ..presets import with_preset
from ..tokenizers import UnknownCharactersError
from ..training import checkpoint as ckpt
from ..training import distributed
from ..training.health import HealthGuard
from ..training.lora import attach as attach_lora
from ..training.lora import settings as lora_settings
from ..training.run import check_out_dir, learning_rate
from ..training.trainer import train
from .autosize import autosize_for_train


@dataclass
class TrainRequest:
    """What ``train`` was asked for (the CLI fills it from its flags)."""

    out: Path
    model: str | None = None  # family name; None = what the data implies (or the resumed run)
    data: str | None = None
    data_tgt: str | None = None
    encoding: str | None = None
    preset: str | None = None
    tokenizer: str | None = None
    newline: str | None = None  # normalize (default) or keep CRLF line ends
    text_field: str | None = None  # the text of JSONL records / table rows (default "text")
    fields: dict = field(default_factory=dict)  # config fields given, of any config class
    resume: bool = False
    force: bool = False
    init_from: str | None = None  # start from this pretrained folder (HF or a run)
    quiet: bool = False
    early_stop: bool = False
    lora: dict = field(default_factory=dict)  # the LoraConfig fields given (--lora_rank ...)


def split_for(family: Family, fields: dict) -> tuple[dict, dict]:
    """(model and data fields, training fields); a field of another family is an error."""
    train_names = set(field_names(TrainConfig))
    own = set(family.field_names())
    model, train_fields = {}, {}
    for key, value in fields.items():
        if key in train_names:
            train_fields[key] = value
        elif key in own:
            model[key] = value
        else:
            owners = [f.name for f in FAMILIES.values() if key in f.field_names()]
            where = f" (it belongs to --model {' / '.join(owners)})" if owners else ""
            raise UserError(f"--{key} is not a setting of {family.title} runs{where}")
    return model, train_fields


def _check_prepared_vocabulary(prepared, given: int | None) -> None:
    """--vocab_size names the size of the tokenizer to fit; prepared data has one already,
    so a different size cannot apply (a preset's size, not given, does not count)."""
    if given is not None and prepared.data_meta.get("prepared") \
            and given != prepared.tokenizer.vocab_size:
        raise UserError(f"--vocab_size {given}: {prepared.source} was prepared with a "
                        f"{prepared.tokenizer.vocab_size:,}-id tokenizer; drop --vocab_size, "
                        f"or prepare the text again with it")


def check_char_vocabulary(family: Family, data, tokenizer: str | None, sizes: bool) -> None:
    """--vocab_size is the size of a BPE vocabulary to fit; a char tokenizer's is the text's
    characters, so the flag cannot apply (prepared data: ``_check_prepared_vocabulary``).
    ``sizes``: whether the user gave (or varies) one."""
    sources = data or family.default_data
    sources = [sources] if isinstance(sources, str) else sources
    kind = tokenizer or family.tokenizers[0]
    if sizes and kind == "char" and not any(is_prepared(s) for s in sources):
        raise UserError("--vocab_size sets the size of a BPE vocabulary; a char tokenizer has "
                        "one id per character of the text (add --tokenizer bpe)")


def decay_floor(fields: dict, given: dict, echo=print) -> dict:
    """``fields`` with a min_lr the decay can reach: a --min_lr above the learning rate is an
    error; a preset's (or a resumed run's) above a --learning_rate given below it follows it
    down to a tenth of it (nanoGPT's ratio), said through ``echo``."""
    lr, floor = fields.get("learning_rate"), fields.get("min_lr")
    if lr is None or floor is None or floor <= lr or lr <= 0:  # a rate <= 0: the config's error
        return fields
    if "min_lr" in given:
        raise UserError(f"--min_lr {floor:g} is above the learning rate {lr:g}: the decay "
                        f"would raise the rate")
    echo(f"note: min_lr {floor:g} is above --learning_rate {lr:g}: the rate decays to "
         f"{lr / 10:g} instead (a tenth; --min_lr sets another)")
    return {**fields, "min_lr": lr / 10}


def _train_config(fields: dict, given: dict | None = None, echo=print) -> TrainConfig:
    fields = decay_floor(fields, given or {}, echo)
    try:
        cfg = config_from_dict(TrainConfig, fields)
    except ConfigError as e:
        raise UserError(str(e)) from None
    if cfg.lr_schedule != "noam" and 0 < cfg.max_iters <= cfg.warmup_iters and \
            "warmup_iters" not in (given or {}):  # a preset's warmup, longer than the run
        echo(f"note: the run's {cfg.max_iters:,} steps end inside the preset's "
             f"{cfg.warmup_iters:,}-step warmup: the learning rate never reaches "
             f"{cfg.learning_rate:g} (--warmup_iters sets a shorter warmup)")
    return cfg


def new_run(req: TrainRequest, echo=print):
    """(family, prepared, built, train_cfg) for a run from scratch (or from --init_from)."""
    if req.init_from is not None:
        return pretrained_run(req, echo)
    if req.preset == "finetune":
        raise UserError("--preset finetune holds training settings for a pretrained model: add "
                        "--init_from PATH (a run, a checkpoint or a Hugging Face folder)")
    family = choose_family(req.model, req.data, req.data_tgt)
    split_for(family, req.fields)  # a foreign flag fails before the preset is read
    if req.tokenizer is not None and req.tokenizer not in family.tokenizers:
        raise UserError(f"--tokenizer {req.tokenizer} does not apply to {family.title} runs "
                        f"(they use {' or '.join(family.tokenizers)})")
    check_char_vocabulary(family, req.data, req.tokenizer, "vocab_size" in req.fields)
    check_encoding_applies(req.data or family.default_data, req.encoding)
    base = family.preset(req.preset)
    _note_kept_width(req.preset or family.default_preset, base, req.fields, echo)
    model_f, train_f = split_for(family, with_preset(base, req.fields))
    sized = family.can_autosize and req.preset is None \
        and req.fields.get("time_budget") is not None  # "--time_budget none": max_iters decides
    train_cfg = _train_config(train_f, req.fields, (lambda _: None) if sized else echo)
    if not sized:  # the sizes are known: a setting that cannot work fails before the data
        family.check_fields(model_f)
    _check_launch(family, train_cfg, "lora_rank" in req.lora, req.fields, batch_known=not sized)
    prepared = family.prepare(req.data or family.default_data, req.encoding or "utf-8",
                              model_f, req.tokenizer, req.data_tgt, req.newline,
                              text_field=req.text_field)
    _check_prepared_vocabulary(prepared, req.fields.get("vocab_size"))
    if sized:
        given_model, given_train = split_for(family, req.fields)
        sized = autosize_for_train(prepared.n_train_tokens, len(prepared.val_ids),
                                   prepared.tokenizer.vocab_size, given_model, given_train,
                                   echo=echo)
        model_f, train_f = split_for(family, {**sized, **req.fields})
        train_cfg = _train_config(train_f, req.fields, echo)
    torch.manual_seed(train_cfg.seed)
    built = family.build(prepared, model_f, train_cfg.seed)
    built.meta["preset"] = req.preset or ("autosize" if sized else family.default_preset)
    return family, prepared, built, train_cfg


def _check_launch(family: Family, cfg: TrainConfig, lora: bool, given: dict,
                  batch_known=True) -> None:
    """Refusals that need no data, made before it is read: flags the schedule never reads,
    and torchrun's processes."""
    check_schedule_flags(cfg, given)
    distributed.check_launch(cfg, lora)
    if batch_known:  # autosize picks the batch after reading the corpus
        family.check_batch_split(cfg.batch_size, distributed.launched_world_size(),
                                 cfg.grad_accum)


def check_schedule_flags(cfg: TrainConfig, given) -> None:
    """--learning_rate or --min_lr given (``given``: the names set) for a schedule that never
    reads them: the paper's noam (where Muon's rate still scales by muon_lr / learning_rate)."""
    unread = [f"--{k}" for k in ("learning_rate", "min_lr") if k in given
              and not (k == "learning_rate" and cfg.optimizer == "muon")]
    if cfg.lr_schedule == "noam" and unread:
        raise UserError(f"{' and '.join(unread)} would change nothing: --lr_schedule noam "
                        f"sets the rate from d_model and --warmup_iters alone; drop it")


def _note_kept_width(name: str, preset: dict, given: dict, echo) -> None:
    """A preset that fixes d_ff keeps it when ``--n_embd`` changes the width (``--d_ff``'s
    help says 4 * n_embd by default): say so."""
    d_ff, width = preset.get("d_ff"), given.get("n_embd")
    if d_ff and width and "d_ff" not in given and width != preset.get("n_embd"):
        echo(f"note: preset {name} keeps its d_ff {d_ff} under --n_embd {width} "
             f"({d_ff / width:.3g} x n_embd, where 4 x is the default); pass --d_ff "
             f"{4 * width} for that")


def pretrained_run(req: TrainRequest, echo=print):
    """(family, prepared, built, train_cfg) for ``--init_from``: the source's architecture,
    weights and tokenizer; the training fields of --preset, by default the family's
    ``finetune`` (a preset's model fields do not apply)."""
    source = read_source(req.init_from)
    family = source.family
    if req.model is not None and req.model != family.name:
        raise UserError(f"--init_from {source.path} holds {family.a_title} model, not "
                        f"{FAMILIES[req.model].a_title} one: drop --model or pass --model "
                        f"{family.name}")
    if req.tokenizer is not None:
        raise UserError(f"--tokenizer: a run started from {source.path} keeps its tokenizer; "
                        f"drop the flag")
    model_f, train_f = split_for(family, req.fields)
    family.init_fields(source, model_f)  # a flag that would change the model: before the data
    preset = req.preset or "finetune"
    train_cfg = _train_config({**split_for(family, family.preset(preset))[1], **train_f},
                              req.fields, echo)
    _check_launch(family, train_cfg, "lora_rank" in req.lora, req.fields)
    data = req.data or source.meta.get("data", {}).get("source") or family.default_data
    check_encoding_applies(data, req.encoding)
    meta = source.meta if source.kind == "run" else {}
    try:
        prepared = family.reopen(as_named_now(meta, data) if req.data else meta,
                                 source.tokenizer, data, req.encoding or "utf-8",
                                 req.data_tgt, req.newline, text_field=req.text_field)
    except UnknownCharactersError as e:
        raise UserError(f"{data}: {e}. A character model ({source.path}) can only be "
                        f"fine-tuned on text in its own alphabet: replace those characters, or "
                        f"start from a model whose tokenizer reads any text (one trained with "
                        f"--tokenizer bpe-bytes)") from None
    torch.manual_seed(train_cfg.seed)  # a fresh masked-LM head, dropout
    built, notes = family.start_from(source, prepared, model_f, train_cfg.seed)
    built.meta["preset"] = preset
    echo(f"starting from {source.describe()}: its weights and tokenizer; preset {preset}")
    for line in notes:
        echo(line)
    return family, prepared, built, train_cfg


def resumed_run(req: TrainRequest):
    """(family, prepared, built, train_cfg, saved meta) for ``--resume`` from the newest
    checkpoint."""
    found = ckpt.list_checkpoints(req.out)
    if not found:
        raise UserError(f"nothing to resume in {req.out}: {ckpt.why_no_checkpoint(req.out)}")
    meta = ckpt.read_meta(found[-1])
    family = family_of(meta)
    if req.preset is not None and meta.get("preset", req.preset) != req.preset:
        raise UserError(f"--resume keeps the run's settings; it was trained with --preset "
                        f"{meta['preset']}, not {req.preset}")
    if req.model is not None and req.model != family.name:
        raise UserError(f"{req.out} holds {family.a_title} run, not {FAMILIES[req.model].a_title} "
                        f"run: drop --model")
    if req.tokenizer is not None and req.tokenizer != meta.get("data", {}).get("tokenizer"):
        raise UserError("--resume keeps the run's tokenizer; drop --tokenizer")
    saved = family.saved_fields(meta)
    model_f, train_f = split_for(family, req.fields)
    changed = sorted(k for k, v in model_f.items() if saved.get(k) != v)
    if changed:
        raise UserError(f"--resume keeps the run's model and data settings; {', '.join(changed)} "
                        f"differ(s) from the checkpoint")
    data = meta.get("data", {})
    source = req.data or data.get("source")
    if not source:
        raise UserError(f"{found[-1]}/config.json does not name its corpus; pass --data")
    tokenizer = ckpt.read_tokenizer(found[-1])
    if req.newline is not None and req.newline != data.get("newline", "normalize"):
        raise UserError("--resume keeps the run's --newline; drop it")
    if req.encoding is not None and req.data is None and \
            not same_encoding(req.encoding, data.get("encoding", "utf-8")):
        raise UserError(f"--resume reads the run's own data in its encoding "
                        f"({data.get('encoding', 'utf-8')}); --encoding is for a new --data")
    field = data.get("text_field")  # --data alone (a moved file): the run's field
    if req.text_field is not None and req.text_field != data.get("text_field", "text"):
        if req.data is None:
            raise UserError(f"--resume reads the run's own data by its --text_field "
                            f"({data.get('text_field', 'text')}); another field is for a new "
                            f"--data")
        field = req.text_field  # new text of another shape
    merged = {**(meta.get("train") if isinstance(meta.get("train"), dict) else {}), **train_f}
    fixed = decay_floor(merged, req.fields, lambda _: None)  # resume_notes says the change
    train_cfg = train_config(meta, train_f if fixed is merged else
                             {**train_f, "min_lr": fixed["min_lr"]})
    _check_launch(family, train_cfg, "lora_rank" in req.lora or meta.get("lora") is not None,
                  req.fields)
    prepared = family.reopen(as_named_now(meta, source) if req.data else meta, tokenizer, source,
                             req.encoding or data.get("encoding", "utf-8"), req.data_tgt,
                             text_field=field)
    if isinstance(saved.get("vocab_size"), int):
        family.keep_rows(prepared, saved["vocab_size"])  # a padded table, from --init_from
    try:
        built = family.build(prepared, saved, train_cfg.seed)
    except (KeyError, TypeError) as e:
        raise UserError(f"{found[-1]}/config.json is damaged ({e}); cannot resume") from None
    for key in ("preset", "init_from"):
        if key in meta:
            built.meta[key] = meta[key]
    return family, prepared, built, train_cfg, meta


def resume_notes(meta: dict, state: dict, train_cfg: TrainConfig, model) -> list[str]:
    """What a resume changes in the schedule, said before training (empty when nothing)."""
    old = train_config(meta)
    step, seconds = state.get("step", 0), state.get("train_seconds", 0.0)
    changed = [k for k in ("max_iters", "time_budget", "learning_rate", "min_lr")
               if getattr(old, k) != getattr(train_cfg, k)]
    if not changed:
        return []
    before = learning_rate(old, step, seconds, model)
    after = learning_rate(train_cfg, step, seconds, model)
    what = ", ".join(f"{k} {getattr(old, k)} -> {getattr(train_cfg, k)}" for k in changed)
    if step < train_cfg.warmup_iters and train_cfg.lr_schedule != "noam":
        return [f"resume changes the schedule ({what}): at step {step} the run is still "
                f"warming up (to step {train_cfg.warmup_iters}, learning rate {after:.3g} "
                f"now), then the rate decays over the new length"]
    return [f"resume changes the schedule ({what}): the learning rate at step {step} goes "
            f"from {before:.3g} to {after:.3g}, then decays over the new length"]


def nothing_left(state: dict, cfg: TrainConfig) -> str | None:
    """Why a resumed run has nothing to train, or None."""
    step, seconds = state.get("step", 0), state.get("train_seconds", 0.0)
    if step >= cfg.max_iters:
        return f"it is at step {step} of max_iters {cfg.max_iters}; raise --max_iters"
    if cfg.time_budget is not None and seconds >= cfg.time_budget:
        return (f"it has trained {seconds:.0f}s of its {cfg.time_budget:.0f}s budget; raise "
                f"--time_budget")
    return None


def train_run(req: TrainRequest, echo=print) -> int:
    """Train (or resume) the run ``req`` asks for; returns the exit code."""
    out = Path(req.out)
    if req.resume and req.init_from is not None:
        raise UserError("--resume continues the run's own weights; drop --init_from")
    for source in [req.data] if isinstance(req.data, str) else req.data or []:
        # a run in a folder inside the data folder is skipped when it is read; one in the
        # data folder itself would be read as its text (a bundled name is no folder)
        if source not in BUNDLED and not is_prepared(source) and Path(source).is_dir() and \
                out.resolve() == Path(source).resolve():
            raise UserError(f"--out {out} is the --data folder: the run's files would be read "
                            f"as its text next time; write the run in a folder of its own")
    if req.init_from is not None and Path(req.init_from).resolve() == out.resolve():
        raise UserError(f"--out {out} is the --init_from folder: the new run would write over "
                        f"the model it starts from (--force does not change this); give the "
                        f"run a folder of its own")
    check_out_dir(out, req.resume, req.force)  # refuse before reading or printing anything
    if not (req.resume or req.force or ckpt.holds_run(out)) and (there := ckpt.outputs_in(out)):
        raise UserError(f"--out {out} holds {', '.join(there)}, which the run would write "
                        f"over; give the run another folder, or pass --force to replace them")
    notes, saved = [], None
    if req.resume:
        family, prepared, built, train_cfg, saved = resumed_run(req)
        state = ckpt.read_state(ckpt.list_checkpoints(out)[-1])
        reason = nothing_left(state, train_cfg)
        lora_settings(req.lora, (saved or {}).get("lora"), resume=True)  # refused either way
        if reason:
            echo(f"nothing to train in {out}: {reason}")
            return 0
        notes = resume_notes(saved, state, train_cfg, built.model)
    else:
        family, prepared, built, train_cfg = new_run(req, echo)
    # LoRA: adapters injected into the model (from scratch, --init_from or resumed); None if off
    lora = attach_lora(built.model, built.meta, req.lora, saved, req.resume)
    if not req.quiet:
        for line in family.describe(prepared, built, train_cfg):
            echo(line)
        if lora:
            echo(lora.summary())
        echo(f"run folder {out}")
    if lora and req.init_from is None and not req.resume:
        echo("note: LoRA without --init_from trains adapters on frozen random weights; to "
             "fine-tune, start from a trained model with --init_from PATH")
    for line in notes:
        echo(line)
    result = train(built.model, prepared.tokenizer, built.task, train_cfg, out, built.meta,
                   resume=req.resume, force=req.force,
                   progress=not req.quiet and sys.stderr.isatty() or None,
                   health=HealthGuard(early_stop=req.early_stop), lora=lora)
    if result.interrupted:
        return 130
    if lora:  # the family's closing step sees the plain model, as saved (adapters merged)
        built.model = lora.merge_in_place()
    if train_cfg.shard:  # the shards ended with their processes: finish with the whole model
        built.model = load_checkpoint(out, device=next(built.model.parameters()).device)[0]
    now = f" ({result.step - result.start_step} now)" if result.start_step else ""  # resumed
    echo(f"done: {result.step} steps{now} in {result.train_seconds:.0f}s of training; "
         f"val loss {result.val_loss:.4f} (best {result.best_val_loss:.4f})")
    for line in family.finish(out, result, prepared, built, train_cfg):
        echo(line)
    return 0
