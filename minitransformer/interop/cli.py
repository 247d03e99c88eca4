"""Commands on Hugging Face folders: ``embed --hf PATH "sentence" ...`` and ``sample --hf PATH``.

    minitransformer embed --hf path/to/all-MiniLM-L6-v2 "A man is eating food." "A man eats."
    minitransformer sample --hf path/to/gpt2 --prompt "Hello, I'm a language model,"
    minitransformer export runs/shakespeare --hf exported/   (GPT2LMHeadModel.from_pretrained)
"""

from __future__ import annotations

import json
import sys

import torch

from ..errors import UserError
from ..models import GPT, EncoderModel
from .hf import describe, load_hf, save_hf
from .tokenizer import load_hf_tokenizer


def add_parsers(sub) -> None:
    """Add ``embed`` and ``export`` beside the core subcommands."""
    e = sub.add_parser(
        "embed", help="sentence embeddings from a BERT-style model (e.g. all-MiniLM-L6-v2)",
        description="Mean-pool the encoder's last hidden states over the real tokens and "
                    "L2-normalise, as sentence-transformers does. One sentence: prints its "
                    "embedding. Several: prints their cosine similarity matrix.")
    e.add_argument("sentences", nargs="+", metavar="SENTENCE", help="text to embed")
    e.add_argument("--hf", required=True, metavar="PATH",
                   help="local Hugging Face folder (config.json, model.safetensors, tokenizer)")
    e.add_argument("--embeddings", action="store_true",
                   help="print the embeddings even for several sentences")
    e.add_argument("--json", action="store_true",
                   help="print JSON: {sentences, embeddings, similarity}")
    e.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda", "mps"])
    e.set_defaults(func=cmd_embed)

    x = sub.add_parser(
        "export", help="write a trained GPT as a Hugging Face GPT-2 folder",
        description="Write config.json, model.safetensors and tokenizer.json that "
                    "transformers' GPT2LMHeadModel.from_pretrained and "
                    "PreTrainedTokenizerFast(tokenizer_file=...) load. Needs GPT-2's options: "
                    "learned positions, Pre-LN, biases.")
    x.add_argument("dir", help="run folder (or checkpoint folder)")
    x.add_argument("--hf", required=True, metavar="PATH", help="folder to write")
    x.add_argument("--which", choices=["best", "last"], default="best")
    x.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    from ..training import checkpoint as ckpt

    model, tokenizer = ckpt.load_checkpoint(args.dir, args.which, "cpu")
    folder = save_hf(model, args.hf, tokenizer)
    print(f"wrote {folder}/ (config.json, model.safetensors, tokenizer.json): "
          f"{describe(model)}")
    print(f"try it: minitransformer sample --hf {folder} --prompt ...")
    return 0


def _device(name: str) -> torch.device:
    from ..training.device import pick_device
    return pick_device(name)


def embed_sentences(model: EncoderModel, tokenizer, sentences: list[str],
                    device="cpu") -> torch.Tensor:
    """Normalised sentence embeddings (N, C)."""
    ids, mask = tokenizer.batch(sentences)
    if len(ids[0]) > model.config.block_size:
        raise UserError(f"a sentence is longer than the model's {model.config.block_size} "
                        f"positions")
    ids = torch.tensor(ids, device=device)  # (N, T)
    mask = torch.tensor(mask, device=device)  # (N, T)
    return model.embed(ids, mask).float().cpu()  # (N, C)


def cmd_embed(args) -> int:
    device = _device(args.device)
    model = load_hf(args.hf, device)
    if not isinstance(model, EncoderModel):
        raise UserError(f"{args.hf} holds a {type(model).__name__}; embed needs a BERT-style "
                        f"encoder such as all-MiniLM-L6-v2")
    tokenizer = load_hf_tokenizer(args.hf, max_length=model.config.block_size)
    emb = embed_sentences(model, tokenizer, args.sentences, device)  # (N, C)
    sim = emb @ emb.T  # (N, N): cosine similarity, the rows being unit vectors
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
    for i, s in enumerate(args.sentences, 1):
        print(f"[{i}] {s}")
    n = len(args.sentences)
    print("cosine similarity")
    print("     " + "".join(f"{f'[{j}]':>8}" for j in range(1, n + 1)))
    for i in range(n):
        print(f"{f'[{i + 1}]':<5}" + "".join(f"{sim[i, j].item():8.4f}" for j in range(n)))
    return 0


def stream_text(tokens, tokenizer):
    """Turn a stream of token ids (each (1, 1)) into text pieces, holding back a piece while
    it ends inside a multi-byte character (byte-level BPE splits UTF-8 sequences)."""
    ids, shown = [], ""
    for tok in tokens:
        ids.extend(tok[0].tolist())
        text = tokenizer.decode(ids)
        if text.endswith("\ufffd"):
            continue  # wait for the rest of the character
        yield text[len(shown):]
        shown = text
    text = tokenizer.decode(ids)
    if len(text) > len(shown):
        yield text[len(shown):]


def cmd_sample_hf(args) -> int:
    """``sample --hf PATH``: continue a prompt with a Hugging Face GPT-2 folder."""
    from ..commands import check_sampling_args

    check_sampling_args(args)
    device = _device(args.device)
    model = load_hf(args.hf, device)
    if not isinstance(model, GPT):
        raise UserError(f"{args.hf} holds a {type(model).__name__}; sample needs a GPT-2 folder")
    tokenizer = load_hf_tokenizer(args.hf)
    ids = tokenizer.encode(args.prompt)
    if not ids:
        raise UserError("the prompt encodes to no tokens")
    if max(ids) >= model.config.vocab_size:
        raise UserError(f"the tokenizer in {args.hf} does not fit the model (token id "
                        f"{max(ids)} >= vocab_size {model.config.vocab_size})")
    print(describe(model), file=sys.stderr)
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    out = sys.stdout
    out.write(args.prompt)
    out.flush()
    tokens = model.stream(idx, args.max_new_tokens, args.temperature, args.top_k, args.top_p,
                          args.seed, use_cache=not args.no_cache)
    for piece in stream_text(tokens, tokenizer):
        out.write(piece)
        out.flush()
    out.write("\n")
    return 0
