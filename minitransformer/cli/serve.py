"""``serve``: one run behind an OpenAI-compatible API and a playground page.

    minitransformer serve runs/shakespeare                 # http://127.0.0.1:8000/
    minitransformer serve runs/shakespeare --host 0.0.0.0 --api_key KEY --port 8080
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import UserError
from ..families import load_run
from ..training.device import decoding_threads, pick_device
from ..viz.i18n import LANGS
from .flags import add_device, add_which, api_key, port_number, positive_int

EPILOG = """\
The API speaks OpenAI's completions protocol: point the openai client (or curl, LangChain,
an evaluation harness) at http://HOST:PORT/v1, with the run folder's name as the model
(GET /v1/models lists it).
A host outside the loopback range needs --api_key (clients send 'Authorization: Bearer KEY')
or, knowingly, --insecure_no_key."""


def add_parser(sub) -> None:
    s = sub.add_parser("serve", help="serve a run: OpenAI-compatible API and a playground page",
                       epilog=EPILOG,
                       description="Serve a trained run over HTTP: /v1/completions for the "
                                   "openai client, and a playground page at /.")
    s.add_argument("dir", help="run folder (or checkpoint folder)")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on; anything outside 127.0.0.0/8 and ::1 needs "
                        "--api_key (default 127.0.0.1)")
    s.add_argument("--port", type=port_number, default=8000,
                   help="port to listen on, 0 to 65535; 0 = any free port (default 8000)")
    s.add_argument("--api_key", type=api_key, default=None,
                   help="require 'Authorization: Bearer KEY' on /v1 and /api (default none)")
    s.add_argument("--insecure_no_key", action="store_true",
                   help="serve a non-loopback host without an API key (default off)")
    s.add_argument("--max_queue", type=positive_int, default=64,
                   help="requests waiting or running at once; one more is answered 429 "
                        "(default 64)")
    s.add_argument("--max_batch", type=positive_int, default=16,
                   help="unseeded one-prompt requests with the same sampling settings "
                        "decoded together as one batch, prompts of any length; a seeded or "
                        "several-prompt request is decoded alone; 1 = one at a time "
                        "(default 16)")
    s.add_argument("--max_tokens", type=positive_int, default=1024,
                   help="the most tokens one request may ask for (default 1024)")
    s.add_argument("--lang", choices=LANGS, default="en",
                   help="the language the playground and its walkthroughs open in, en or zh "
                        "(default en); a button on the page switches")
    add_which(s)
    add_device(s)
    s.set_defaults(func=cmd_serve)


def _check_host(args) -> None:
    from ..serve import is_loopback

    if args.insecure_no_key and (is_loopback(args.host) or args.api_key):
        why = "--api_key is given" if args.api_key else f"--host {args.host} is loopback"
        raise UserError(f"--insecure_no_key is for serving another host without a key, and "
                        f"{why}; drop it")
    if is_loopback(args.host) or args.api_key:
        return
    if not args.insecure_no_key:
        raise UserError(f"--host {args.host} is reachable from other machines: give --api_key "
                        f"KEY, or --insecure_no_key to serve without one")
    print(f"warning: serving {args.host} without an API key: anyone who can reach this "
          f"machine can use the model", file=sys.stderr)


def cmd_serve(args) -> int:
    # FastAPI and uvicorn load here, not with the CLI: every other command starts faster
    from ..serve import Settings, bind, create_app, make_server, url_of

    _check_host(args)
    device = pick_device(args.device)
    run = load_run(args.dir, args.which, device)
    if "sample" not in run.family.commands and "translate" not in run.family.commands:
        print(f"note: {run.family.title} runs have no completions or translations to serve "
              f"yet; the API answers with errors", file=sys.stderr)
    if "sample" in run.family.commands:  # one-token steps of a decoder-only model
        decoding_threads(run.model, device)
    sock = bind(args.host, args.port)
    name = Path(args.dir).resolve().name or "model"  # the run's name, whichever checkpoint
    settings = Settings(model_id=name, api_key=args.api_key,
                        max_queue=args.max_queue, max_tokens=args.max_tokens,
                        max_batch=args.max_batch, lang=args.lang)
    app = create_app(run, settings)
    url = url_of(sock)
    print(f"serving {run.family.title} run {settings.model_id!r} on {url} (playground), "
          f"{url}v1 (OpenAI API); Ctrl-C stops", file=sys.stderr)
    try:
        make_server(app).run(sockets=[sock])
    finally:
        sock.close()
    return 0
