"""``minitransformer evaluate DIR``: the family's measures of a run (or checkpoint) folder.

GPT: val loss, perplexity, bits per token; encoder: masked-LM loss and accuracy; seq2seq: val
loss, then BLEU greedy and with beam search. The val loss is the trainer's own measure, on
the same batches and in the same precision, so it matches the figure training printed.
"""

from __future__ import annotations

from ..families import load_run
from ..families.base import NotApplicable
from ..families.seq2seq import BLEU_TOKENIZERS
from ..training.device import pick_device
from .flags import (
    add_decoding_flags,
    add_device,
    add_run_dir,
    data_flag,
    nonneg_int,
    positive_int,
    seed,
)

OPTIONS = ("data", "encoding", "text_field", "eval_iters", "batch_size", "seed", "split", "limit",
           "examples", "beam", "length_penalty", "max_len", "bleu_tokenize", "src", "tgt",
           "data_tgt")


def add_parser(sub) -> None:
    e = sub.add_parser("evaluate", help="val loss and the family's measures (BLEU for seq2seq)")
    add_run_dir(e)
    e.add_argument("--data", action="extend", nargs="+", default=None, metavar="CORPUS",
                   help="corpus to score (default: the one it was trained on; several, as "
                        "train takes them: --data A B or --data A --data B); GPT and "
                        "encoder runs score another text (a test file) by eval_iters x "
                        "batch_size windows drawn from all of it, their own (even moved or "
                        "copied) and a prepared folder by its val split, as training measured "
                        "it")
    e.add_argument("--encoding", default=None,
                   help="text encoding of --data (default: the run's)")
    e.add_argument("--text_field", default=None, metavar="NAME",
                   help="the field of --data's JSONL records or table rows that holds the text "
                        "(default: the run's for its own data, else text)")
    e.add_argument("--eval_iters", type=positive_int, default=None,
                   help="batches averaged for the val loss (default: the run's eval_iters)")
    e.add_argument("--batch_size", type=positive_int, default=None,
                   help="batch size of the val loss (default: the run's batch_size)")
    e.add_argument("--seed", type=seed, default=None,
                   help="seed of the val batches (default 0, as in training)")
    add_decoding_flags(e)
    g = e.add_argument_group("BLEU (encoder-decoder runs)")
    g.add_argument("--data_tgt", default=None, metavar="FILE",
                   help="a test set as two aligned files: --data the source sentences, "
                        "--data_tgt the target sentences, one per line")
    g.add_argument("--src", default=None, metavar="COLUMN",
                   help="source column of a --data TSV: a header name or an index (default: "
                        "as in training)")
    g.add_argument("--tgt", default=None, metavar="COLUMN",
                   help="target column of a --data TSV (default: as in training)")
    g.add_argument("--split", choices=["test", "valid", "train"], default=None,
                   help="the split to score with BLEU (default test; with --data naming "
                        "another corpus than the run's, all of its pairs)")
    g.add_argument("--limit", type=positive_int, default=None,
                   help="score only the first N pairs of the split")
    g.add_argument("--examples", type=nonneg_int, default=None,
                   help="print this many example translations (default 3)")
    g.add_argument("--bleu_tokenize", choices=BLEU_TOKENIZERS, default=None,
                   help="how sacreBLEU cuts sentences into words (default auto: zh when the "
                        "references are mostly Chinese, else 13a)")
    add_device(e)
    e.set_defaults(func=cmd_evaluate)


def cmd_evaluate(args) -> int:
    args.data = data_flag(args.data)  # one source a string, as the run's config.json holds it
    options = {k: getattr(args, k) for k in OPTIONS if getattr(args, k) is not None}
    if args.encoding is not None and args.data is None:
        raise NotApplicable("--encoding is the encoding of --data; without it the run's own "
                            "data is read in the run's encoding")
    if args.text_field is not None and args.data is None:
        raise NotApplicable("--text_field names the text of --data; without it the run's own "
                            "data is read by the run's own field")
    device = pick_device(args.device)
    run = load_run(args.dir, args.which, device)
    foreign = sorted(set(options) - run.family.evaluate_options)
    if foreign:
        raise NotApplicable(f"--{foreign[0]} does not apply to evaluating "
                            f"{run.family.title} runs")
    for line in run.family.evaluate(run.model, run.tokenizer, run.meta, options, device):
        print(line)
    return 0
