"""Hugging Face folders: ``embed --hf PATH "sentence" ...`` and ``export DIR --hf OUT``.

    minitransformer embed --hf path/to/all-MiniLM-L6-v2 "A man is eating food." "A man eats."
    minitransformer export runs/shakespeare --hf exported/   (AutoModelForCausalLM, AutoTokenizer)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..data.shards import MANIFEST
from ..errors import UserError
from ..families import load_run
from ..families.base import chain_start
from ..interop import describe, load_hf, save_hf
from ..interop.hf import check_export_folder
from ..interop.sentence import Pooling, default_prompt, read_pooling, sentence_texts
from ..interop.tokenizer import load_hf_tokenizer
from ..models import EncoderModel
from ..training import checkpoint as ckpt
from ..training.device import pick_device
from .flags import HelpFormatter, add_device, add_run_dir, cli_text


def add_embed(sub) -> None:
    e = sub.add_parser(
        "embed", help="sentence embeddings from a BERT-style model (e.g. all-MiniLM-L6-v2)",
        description="Read each sentence as the folder's sentence-transformers settings "
                    "say (its default prompt first, lowercased where do_lower_case), then "
                    "pool the encoder's last hidden states as its modules say (mean, cls or "
                    "max; then L2-normalise where it has a Normalize module), as "
                    "SentenceTransformer.encode does; a folder "
                    "without modules.json: the normalised mean. One sentence: prints its "
                    "embedding. Several: prints their cosine similarity matrix. A sentence "
                    "past the folder's max length (max_seq_length, else model_max_length) is "
                    "embedded from its first tokens, with a note.")
    e.add_argument("sentences", nargs="+", type=cli_text, metavar="SENTENCE", help="text to embed")
    e.add_argument("--hf", required=True, metavar="PATH",
                   help="local Hugging Face folder (config.json, model.safetensors, tokenizer)")
    e.add_argument("--embeddings", action="store_true",
                   help="print the embeddings even for several sentences")
    e.add_argument("--json", action="store_true",
                   help="print JSON: {sentences, embeddings, similarity}")
    add_device(e)
    e.set_defaults(func=cmd_embed)


EXPORT_HELP = """\
in Python, with transformers installed:
  tok = AutoTokenizer.from_pretrained(OUT)         # a fast tokenizer with the run's ids
  model = AutoModelForCausalLM.from_pretrained(OUT)
  out = model.generate(**tok("ROMEO:", return_tensors="pt"), max_new_tokens=50, do_sample=False)
  tok.decode(out[0], skip_special_tokens=True)     # = sample RUN --temperature 0 --prompt
                                                   #   ROMEO: --max-new-tokens 50
tokenizer: a BPE run's <|endoftext|> is its bos and eos token; generate stops there, as
serve's completions do, while sample never does (a run's corpus without that text never
teaches the model to write it); a run from a Hugging Face folder keeps the folder's roles. A
char run has no special tokens, and characters it never saw encode as '?' (else '\uff1f',
'\ufffd' or a space, else the first character of its vocabulary; no new id, as the model has
none to spare): AutoTokenizer never raises, but such text does not decode back as it was,
while sample refuses it (sample --hf and train --init_from read the folder's characters as
the run did). generate stops at the context window (block_size tokens, prompt included);
sample slides past it."""


EXPORT_DESCRIPTION = """\
Write config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json and special_tokens_map.json: transformers'
AutoModelForCausalLM.from_pretrained(OUT) gives a model with the run's weights and
AutoTokenizer.from_pretrained(OUT) a fast tokenizer with the run's ids (char or BPE). The model
is a LlamaForCausalLM for a Llama-shaped run (rmsnorm, swiglu, rope, Pre-LN, no biases; with
qk_norm a Qwen3ForCausalLM), else a GPT2LMHeadModel, which needs GPT-2's options: learned
positions, Pre-LN, biases.

OUT must be a folder of its own: a run folder (or a checkpoint in it) is always refused, as
its own config.json, model.safetensors and tokenizer.json would be replaced. Files of the
names above already in OUT are replaced only with --force; other files are left alone."""


class _RawFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """The description and the Python example below kept as written."""


def add_export(sub) -> None:
    x = sub.add_parser(
        "export", help="write a trained GPT as a Hugging Face GPT-2, Llama or Qwen3 folder",
        description=EXPORT_DESCRIPTION, epilog=EXPORT_HELP, formatter_class=_RawFormatter)
    add_run_dir(x)
    x.add_argument("--hf", required=True, metavar="PATH",
                   help="folder to write (created if missing); never a run folder")
    x.add_argument("--force", action="store_true",
                   help="replace the files of an earlier export in PATH (config.json, "
                        "model.safetensors, tokenizer.json, ...); other files stay (default "
                        "off: such a folder is refused)")
    x.set_defaults(func=cmd_export)


def refuse_run_folder(path) -> None:
    """Refuse an export into a run or checkpoint folder, anywhere in a run's checkpoints/, or
    into prepared data: the Hugging Face config.json, model.safetensors and tokenizer.json
    would replace the run's own (or the data's tokenizer), whatever --force says."""
    run = ckpt.run_containing(path)
    if run is not None:
        raise UserError(f"--hf {path} is a minitransformer run or checkpoint folder (or lies "
                        f"in a run's checkpoints/): export would replace its config.json, "
                        f"model.safetensors and tokenizer.json; choose another folder, e.g. --hf "
                        f"{run.parent / (run.name + '-hf')}")
    if (Path(path) / MANIFEST).exists():
        raise UserError(f"--hf {path} holds prepared data ({MANIFEST}), whose tokenizer.json "
                        f"export would replace; choose another folder")


def cmd_export(args) -> int:
    refuse_run_folder(args.hf)  # both checks before the model is loaded or anything written
    check_export_folder(args.hf, args.force)
    run = load_run(args.dir, args.which, "cpu")
    run.family.require("export")
    start = chain_start(run.meta)  # the Hugging Face folder the run began from, if any
    folder = save_hf(run.model, args.hf, run.tokenizer, start.get("special_tokens"),
                     start.get("positions"))
    print(f"wrote {folder}/ (config.json, model.safetensors, tokenizer.json, ...): "
          f"{describe(run.model)}")
    print(f"try it: minitransformer sample --hf {folder} --prompt ...; or in Python "
          f"AutoModelForCausalLM.from_pretrained and AutoTokenizer.from_pretrained")
    return 0


def embed_sentences(model: EncoderModel, tokenizer, sentences: list[str], device="cpu",
                    pooling: Pooling = Pooling()):
    """Sentence embeddings (N, C), pooled as the folder says (normalised mean by default). A
    sentence longer than the tokenizer's limit is embedded from its first tokens, as
    sentence-transformers does, with a note on stderr."""
    import torch

    for i, length in tokenizer.over_length(sentences):
        print(f"note: sentence [{i + 1}] is {length} tokens; embedded from its first "
              f"{tokenizer.max_length} (the folder's max length)", file=sys.stderr)
    ids, mask = tokenizer.batch(sentences)
    if len(ids[0]) > model.config.block_size:
        raise UserError(f"a sentence is longer than the model's {model.config.block_size} "
                        f"positions")
    ids = torch.tensor(ids, device=device)  # (N, T)
    mask = torch.tensor(mask, device=device)  # (N, T)
    return model.embed(ids, mask, pooling=pooling.mode,
                       normalize=pooling.normalize).float().cpu()  # (N, C)


def _print_similarity(sentences: list[str], sim) -> None:
    for i, s in enumerate(sentences, 1):
        print(f"[{i}] {s}")
    n = len(sentences)
    print("cosine similarity")
    print("     " + "".join(f"{f'[{j}]':>8}" for j in range(1, n + 1)))
    for i in range(n):
        print(f"{f'[{i + 1}]':<5}" + "".join(f"{sim[i, j].item():8.4f}" for j in range(n)))


def cmd_embed(args) -> int:
    import torch

    device = pick_device(args.device)
    pooling = read_pooling(args.hf)  # before the weights are read
    texts = sentence_texts(args.hf, args.sentences)  # a default prompt, lowercased
    if not pooling.include_prompt and default_prompt(args.hf):
        raise UserError(f"{args.hf} pools without its prompt's tokens (include_prompt false), "
                        f"which embed does not implement")
    model = load_hf(args.hf, device)
    if not isinstance(model, EncoderModel):
        raise UserError(f"{args.hf} holds a {type(model).__name__}; embed needs a BERT-style "
                        f"encoder such as all-MiniLM-L6-v2")
    tokenizer = load_hf_tokenizer(args.hf, max_length=model.config.block_size)
    emb = embed_sentences(model, tokenizer, texts, device, pooling)  # (N, C)
    unit = torch.nn.functional.normalize(emb, dim=-1)  # (N, C)
    sim = unit @ unit.T  # (N, N): cosine similarity
    if args.json:
        print(json.dumps({"sentences": args.sentences, "embeddings": emb.tolist(),
                          "similarity": sim.tolist()}))
        return 0
    if len(args.sentences) == 1 or args.embeddings:
        for s, row in zip(args.sentences, emb.tolist(), strict=True):
            if len(args.sentences) > 1:
                print(f"# {s}")
            print(" ".join(f"{v:.6f}" for v in row))
        if len(args.sentences) == 1:
            return 0
    _print_similarity(args.sentences, sim)
    return 0
