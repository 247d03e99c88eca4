"""Looking inside a model: ``attention`` (heatmaps as PNG) and ``explain`` (an HTML page).

    minitransformer attention runs/shakespeare --text "ROMEO: But soft" --out attn.png
    minitransformer explain runs/shakespeare --text "ROMEO:" --out walkthrough.html
    minitransformer explain --worked_example --out worked.html
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from ..families import load_run
from ..families.base import data_label
from ..viz.heatmap import SOFTWARE, save_attention_png
from ..viz.i18n import LANGS, msg
from ..viz.page import GENERATOR, write_page
from ..viz.worked import worked_example_doc
from .flags import add_run_dir, add_which, cli_text, nonneg_int

SUFFIXES = {".html": (".html", ".htm"), ".png": (".png",)}


def _check_out(out: str, suffix: str, force: bool) -> Path:
    """``--out`` as a path to write: ending in ``suffix`` (a page in .htm too), and where a
    file is there already, one this command wrote (a page with its generator tag, a PNG with
    its Software text), unless ``force``: never a file of the user's own."""
    path = Path(out)
    if path.suffix.lower() not in SUFFIXES[suffix]:
        raise UserError(f"--out {out} should end in {' or '.join(SUFFIXES[suffix])}")
    if path.is_dir():
        raise UserError(f"--out {out} is a folder; give a file name ending in {suffix}")
    mark = GENERATOR.encode() if suffix == ".html" else b"Software\x00" + SOFTWARE.encode()
    if path.exists() and not force:
        try:
            with open(path, "rb") as f:
                ours = mark in f.read(1 << 16)
        except OSError as e:
            raise UserError(f"cannot read --out {out}: {e.strerror or e}") from None
        if not ours:
            raise UserError(f"--out {out} exists and does not carry this command's mark (its "
                            f"own files do, since this version); give another name, or pass "
                            f"--force to replace it")
    return path


def cmd_attention(args) -> int:
    out = _check_out(args.out, ".png", args.force)
    run = load_run(args.dir, args.which, "cpu")
    views = run.family.attention_views(run.model, run.tokenizer, args.text, args.target)
    save_attention_png(views, out, args.layer, args.head, title=args.title, lang=args.lang)
    shown = [f"layer {args.layer}" if args.layer is not None else "every layer",
             f"head {args.head}" if args.head is not None else "every head"]
    shape = ", ".join(f"{v.name}: {plural(v.n_layer, 'layer')} x {plural(v.n_head, 'head')}"
                      for v in views)
    print(f"wrote {out} ({' and '.join(shown)} of {shape})")
    return 0


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def cmd_explain(args) -> int:
    out = _check_out(args.out, ".html", args.force)
    if args.worked_example:
        if args.dir or args.text is not None:
            raise UserError("--worked_example takes no checkpoint folder or --text")
        given = next((f for f in ("layer", "head", "top_k", "which")
                      if getattr(args, f) is not None), None)
        if given:
            raise UserError(f"--{given} picks what a model's page shows; the worked example "
                            f"has none")
        write_page(worked_example_doc(), out, args.lang)
        print(f"wrote {out} (the worked example)")
        return 0
    if not args.dir:
        raise UserError("give a checkpoint folder (or --worked_example)")
    if args.text is None:
        raise UserError("give the text to walk through with --text")
    run = load_run(args.dir, args.which, "cpu")
    run.family.require("explain")
    source = data_label(run.meta, str(args.dir))
    doc = run.family.explain(run.model, run.tokenizer, args.text, args.layer or 0,
                             args.head or 0, 10 if args.top_k is None else args.top_k,
                             msg("walk.trained_on", source=source))
    write_page(doc, out, args.lang)
    print(f"wrote {out} ({len(doc['steps'])} steps, {doc['n_layer']} layers x "
          f"{doc['n_head']} heads); open it in a browser, no network needed")
    return 0


def add_attention(sub) -> None:
    a = sub.add_parser("attention", help="attention heatmaps of a checkpoint on a text (PNG)",
                       description="Draw the attention weights of every layer and head "
                       "(a grid: one row per layer, one column per head) for TEXT.")
    add_run_dir(a)
    a.add_argument("--text", required=True, type=cli_text, help="the text to run through the model")
    a.add_argument("--target", default=None, type=cli_text,
                   help="encoder-decoder models: the decoder's text (e.g. the translation)")
    a.add_argument("--out", required=True,
                   help="PNG file to write (over one this command wrote; any other: --force)")
    a.add_argument("--force", action="store_true", help="replace any file at --out")
    a.add_argument("--layer", type=nonneg_int, default=None, help="only this layer")
    a.add_argument("--head", type=nonneg_int, default=None, help="only this head")
    a.add_argument("--title", default=None, help="a title above the grid")
    a.add_argument("--lang", choices=LANGS, default="en",
                   help="the language of the labels, en or zh (default en)")
    a.set_defaults(func=cmd_attention)


def add_explain(sub) -> None:
    e = sub.add_parser("explain", help="an offline HTML walkthrough of the forward pass",
                       description="Write one self-contained HTML page that walks through "
                       "the model's real forward pass on TEXT in 8 steps, or the worked "
                       "example of attention by hand (--worked_example).")
    e.add_argument("dir", nargs="?", default=None, help="run folder (or checkpoint folder)")
    e.add_argument("--text", default=None, type=cli_text, help="the text to walk through")
    e.add_argument("--out", required=True,
                   help="HTML file to write (over one this command wrote; any other: --force)")
    e.add_argument("--force", action="store_true", help="replace any file at --out")
    e.add_argument("--worked_example", action="store_true",
                   help="the hand calculation Q = K = I, V = [[10,20],[30,40]], d_k = 2")
    e.add_argument("--layer", type=nonneg_int, default=None,
                   help="layer shown first (default 0)")
    e.add_argument("--head", type=nonneg_int, default=None, help="head shown first (default 0)")
    e.add_argument("--top_k", type=nonneg_int, default=None,
                   help="how many next-token probabilities to list (default 10)")
    e.add_argument("--lang", choices=LANGS, default="en",
                   help="the language the page opens in, en or zh (default en); a button on "
                        "the page switches")
    add_which(e)
    e.set_defaults(func=cmd_explain)
