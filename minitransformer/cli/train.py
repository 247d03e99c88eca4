"""``minitransformer train``: one command for every model family.

    minitransformer train --data shakespeare --out runs/shakespeare           (GPT, cpu-small)
    minitransformer train --model encoder --data shakespeare --out runs/mlm   (masked LM)
    minitransformer train --data bible_en_es --out runs/en-es                 (seq2seq: a .tsv)
    minitransformer train --out runs/shakespeare --resume --max_iters 5000
    minitransformer train --init_from runs/shakespeare --data my.txt --out runs/mine
"""

from __future__ import annotations

from pathlib import Path

from ..config import TrainConfig
from ..experiments.runs import TrainRequest, train_run
from ..families import FAMILIES, choose_family
from ..training.lora import LoraConfig
from .flags import add_config_flags, add_tokenizer_flag, config_values, data_flag


def _config_groups() -> list[tuple[type, str]]:
    """Every family's config classes, then TrainConfig: the flag groups of train and compare
    (a field shared by several classes is listed under the first)."""
    groups = []
    for family in FAMILIES.values():
        for cls in (family.config_class, *family.data_classes):
            where = "most shared by every family" if not groups else f"--model {family.name}"
            groups.append((cls, f"{family.title} ({cls.__name__}; {where})"))
    return groups + [(TrainConfig, "training (TrainConfig)")]


CONFIG_GROUPS = _config_groups()


def add_early_stop(parser) -> None:
    parser.add_argument("--early_stop", action="store_true",
                        help="stop when val loss has risen while train loss fell for 3 "
                             "evaluations in a row (the best model is kept either way)")


def add_parser(sub) -> None:
    t = sub.add_parser(
        "train", help="train a model on a corpus (any family), or resume a run",
        usage="minitransformer train --data CORPUS --out DIR [--preset NAME] "
              "[--model gpt|encoder|seq2seq] [--resume | --init_from PATH] [--FIELD VALUE ...]",
        description="Train a model. Any config field is a flag: --n_layer 4 ... The defaults "
                    "shown are those of the default preset, cpu-small, of the GPT family "
                    "(fields of the other families: their own cpu-small); every preset's "
                    "values: minitransformer presets. A flag given wins over the preset. "
                    "--time_budget without --preset sizes a GPT to the budget instead "
                    "(autosize, said when it starts). A run ends at --max_iters or its "
                    "--time_budget, whichever comes first, and its learning rate decays by "
                    "the same.")
    t.add_argument("--data", action="extend", nargs="+", metavar="CORPUS",
                   help="corpus: a bundled name (shakespeare, tang, sayings, bible_en_es), a "
                        "text file, a folder, a glob, JSONL, Parquet, a datasets save_to_disk "
                        "folder, or a DATA_DIR from prepare; several (--data A B, or --data "
                        "given again) are prepared together, in that order. Anything but a "
                        "DATA_DIR is prepared once into the cache (see docs/data.md) and read "
                        "from there (default shakespeare; bible_en_es for seq2seq; on "
                        "--resume, the run's own corpus)")
    t.add_argument("--data_tgt", default=None, metavar="FILE",
                   help="seq2seq from two aligned files: --data has the source sentences, "
                        "--data_tgt the target sentences, one per line")
    t.add_argument("--out", required=True, help="run folder to write")
    t.add_argument("--model", default=None, choices=list(FAMILIES),
                   help="model family (default gpt; sentence pairs imply seq2seq; on "
                        "--resume, the run's own)")
    t.add_argument("--preset", default=None,
                   help="named settings; default cpu-small. " + "; ".join(
                       f"{name}: {', '.join(f.presets)}" for name, f in FAMILIES.items()))
    add_tokenizer_flag(t)
    t.add_argument("--resume", action="store_true", help="continue the run in --out")
    t.add_argument("--init_from", default=None, metavar="PATH",
                   help="start from pretrained weights: a Hugging Face GPT-2, Llama, Qwen3 or "
                        "BERT folder (config.json, model.safetensors, tokenizer files) or a "
                        "run folder; the model keeps its architecture and tokenizer (only "
                        "--dropout, --attn_impl and a smaller --block_size may change), the "
                        "training fields come from --preset (default finetune)")
    t.add_argument("--force", action="store_true", help="replace a run already in --out")
    t.add_argument("--encoding", default=None, help="text encoding of the corpus "
                   "(default utf-8)")
    t.add_argument("--newline", choices=["normalize", "keep"], default=None,
                   help="normalize: read Windows (CRLF) line ends as \\n, saying so; keep: "
                        "train on them as they are (default normalize)")
    t.add_argument("--text_field", default=None, metavar="NAME",
                   help="the field of each JSON Lines record, or the column of a Parquet, "
                        "Arrow or datasets table, that holds its text, in every source "
                        "(default text; on --resume the run's own, or another for a new --data)")
    t.add_argument("--quiet", action="store_true",
                   help="no progress bar and no summary of the corpus, model and budget "
                        "before training")
    add_early_stop(t)
    add_config_flags(t, CONFIG_GROUPS, preset_defaults())
    add_config_flags(t, [(LoraConfig, "LoRA fine-tuning (LoraConfig; needs peft: pip install "
                                      "'minitransformer[lora]')")])
    t.set_defaults(func=cmd_train)


def preset_defaults() -> dict:
    """The values train uses when no preset is named: the default family's default preset
    (and, for fields only another family has, that family's)."""
    first = choose_family(None)
    shown = first.preset(None)
    for family in FAMILIES.values():
        own = set(family.field_names()) - set(first.field_names())
        shown.update({k: v for k, v in family.preset(None).items() if k in own})
    return shown


def cmd_train(args) -> int:
    classes = [cls for cls, _ in CONFIG_GROUPS]
    request = TrainRequest(
        out=Path(args.out), model=args.model, data=data_flag(args.data),
        data_tgt=args.data_tgt,
        encoding=args.encoding, preset=args.preset, tokenizer=args.tokenizer,
        newline=args.newline, text_field=args.text_field,
        fields=config_values(args, classes), resume=args.resume, force=args.force,
        init_from=args.init_from,
        quiet=args.quiet, early_stop=args.early_stop, lora=config_values(args, [LoraConfig]))
    return train_run(request)
