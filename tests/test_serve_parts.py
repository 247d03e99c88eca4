"""The parts of ``serve`` alone: the decoding loop against ``GPT.generate``, stop strings and
held-back text, the queue's limit, the host check, and the command's exit codes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import threading

import pytest
import torch

from minitransformer.cli import build_parser, main
from minitransformer.config import GPTConfig
from minitransformer.models import GPT
from minitransformer.serve import is_loopback
from minitransformer.serve.choices import Choice, held_back
from minitransformer.serve.errors import APIError
from minitransformer.serve.probes import generation_starts, inspect
from minitransformer.serve.sampling import sample_steps
from minitransformer.serve.worker import Worker
from minitransformer.tokenizers import CharTokenizer
from minitransformer.training.checkpoint import write_model_files

pytest.importorskip("fastapi", reason="fastapi and uvicorn are dependencies of serve")


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, None, None), (0.9, 5, None),
                                                     (1.3, None, 0.8)])
def test_the_loop_draws_what_generate_draws_past_the_window(make_gpt, temperature, top_k,
                                                             top_p):
    """Three rows, seeded, 30 tokens after a 6-token prompt: past block_size 16, so the
    window moves and the cache is rebuilt; the tokens equal GPT.generate's."""
    model = make_gpt(scale=0.5)
    idx = torch.randint(0, 13, (3, 6))
    steps = list(sample_steps(model, idx, 30, temperature, top_k, top_p, seed=4,
                              want_logprobs=True))
    ours = torch.cat([t for t, _ in steps], dim=1)  # (3, 30)
    want = model.generate(idx, 30, temperature, top_k, top_p, seed=4)[:, 6:]
    assert torch.equal(ours, want)
    with torch.no_grad():  # the first step's log-probabilities: the uncached model's
        logits, _ = model(idx)
    torch.testing.assert_close(steps[0][1], torch.log_softmax(logits[:, -1], -1))


def test_inspect_shows_each_generated_token_through_its_generation_window(make_gpt):
    """A 20-token prompt past block_size 16, then 16 sampled tokens: at every position from
    the prompt's last on, inspect's probabilities are those of the decoding step that sampled
    the next token (its log-probabilities, from the cached loop)."""
    model = make_gpt(scale=0.5)
    tokenizer = CharTokenizer.fit("abcdefghijklm")
    prompt = torch.randint(0, 13, (1, 20))
    steps = list(sample_steps(model, prompt, 16, 0.9, seed=3, want_logprobs=True))
    ids = torch.cat([prompt, *[t for t, _ in steps]], dim=1)[0].tolist()
    text = tokenizer.decode(ids)
    offsets = set()
    for j, (_, logprobs) in enumerate(steps):
        got = inspect(model, tokenizer, text, 19 + j, 13, prompt=20)
        offsets.add(got["offset"])
        want = torch.sort(logprobs[0].exp(), descending=True).values
        torch.testing.assert_close(torch.tensor([t["prob"] for t in got["top"]]), want)
    # the prompt's last 16 - 4 tokens, then a restart each time the window would pass 16
    assert offsets == {8, 13, 18, 23}
    assert generation_starts(50, 20, 16, 4)[:19] == generation_starts(50, 1, 16, 4)[:19]


class StartedChars(CharTokenizer):
    """Characters with a start token put before every prompt, as Llama's <s> (here "a")."""

    def encode_prompt(self, text: str) -> list[int]:
        return [0, *self.encode(text)]


def test_inspect_keeps_the_start_token_in_the_window_as_generation_does(make_gpt):
    model = make_gpt(scale=0.5)
    tokenizer = StartedChars(list("abcdefghijklm"))
    prompt = torch.tensor([[0, *torch.randint(0, 13, (9,)).tolist()]])  # <s> + 9
    steps = list(sample_steps(model, prompt, 24, 0.9, seed=3, want_logprobs=True,
                              context_keep=1))
    ids = torch.cat([prompt, *[t for t, _ in steps]], dim=1)[0].tolist()
    seen = []
    for j, (_, logprobs) in enumerate(steps):
        got = inspect(model, tokenizer, tokenizer.decode(ids[1:]), 9 + j, 13, prompt=10)
        seen.append((got["kept"], got["offset"], len(got["tokens"])))
        want = torch.sort(logprobs[0].exp(), descending=True).values
        torch.testing.assert_close(torch.tensor([t["prob"] for t in got["top"]]), want)
    # block_size 16, shift 4: the whole text up to 16 tokens, then <s> + the last 11 and on
    assert seen[6] == (0, 0, 16) and seen[7] == (1, 6, 12) and seen[11] == (1, 6, 16)
    assert seen[12] == (1, 11, 12)
    assert generation_starts(30, 10, 16, 4, keep=1)[16] == 6


class Chars:
    """A tokenizer whose ids are code points (decode of one id = one character)."""

    def decode(self, ids):
        return "".join(map(chr, ids))


def _feed(choice: Choice, text: str) -> list[str]:
    shown = []
    for ch in text:
        if choice.finish is not None:
            break
        choice.add(ord(ch), None, 0, Chars())
        shown.append(choice.take()[0])
    return shown


def test_text_that_may_start_a_stop_string_waits():
    c = Choice(0, ["END", "xy"])
    shown = _feed(c, "abEN!Ex")
    # "E" and "EN" may start END, "x" may start xy: held until the next character settles it
    assert shown == ["a", "b", "", "", "EN!", "", "E"]
    assert c.finish is None and held_back("abEx", ["END", "xy"]) == 1
    c.end(Chars())
    assert c.take()[0] == "x"


def test_a_stop_string_ends_the_choice_before_it():
    c = Choice(0, ["END"])
    shown = _feed(c, "hello ENDING more")
    assert "".join(shown) == "hello " and c.finish == "stop"


def test_token_entries_leave_with_their_text():
    c = Choice(0, ["zz"], offset=3)
    lp = torch.log_softmax(torch.arange(200.0), 0)
    for ch in "az":
        c.add(ord(ch), lp, 2, Chars())
    text, entries = c.take()
    assert text == "a" and [e.text for e in entries] == ["a"]  # "z" is held back
    c.end(Chars())
    text, entries = c.take()
    assert text == "z" and [e.text for e in entries] == ["z"] and entries[0].start == 1
    # the 2 most likely, and the token drawn, as OpenAI adds it: most likely first
    assert list(entries[0].top) == [chr(199), chr(198), "z"]
    assert entries[0].top["z"] == pytest.approx(float(lp[ord("z")]))


def test_byte_tokens_get_their_characters_offsets_and_distinct_names():
    """Byte-level BPE: two stray continuation bytes (never a character: U+FFFD each), "，"
    spelled in three byte tokens, "a", then "你" in three: every token's text_offset is its
    character's place, partial tokens are named by their bytes, and the top entries of two
    such tokens stay two entries."""
    from minitransformer.tokenizers.bpe import BPETokenizer

    tok = BPETokenizer.train(["ab ab ab"], 260, byte_level=True)
    byte_id = {tok.token_bytes(i)[0]: i for i in range(tok.vocab_size)
               if tok.token_bytes(i) is not None and len(tok.token_bytes(i)) == 1}
    data = b"\xbd\xa0" + "，a你".encode()
    c = Choice(0, [], offset=5)
    lp = torch.log_softmax(torch.zeros(tok.vocab_size), 0)
    lp[byte_id[0xE4]], lp[byte_id[0xEF]] = 0.5, 0.4  # two partial tokens on top
    shown = []
    for b in data:
        c.add(byte_id[b], lp, 2, tok)
        shown.append(c.take()[0])
    c.end(tok)
    text, entries = c.take()
    assert "".join(shown) + text == "\ufffd\ufffd，a你" == tok.decode([byte_id[b] for b in data])
    # a stray byte shows at once; a character being spelled waits for its last byte
    assert shown == ["\ufffd", "\ufffd", "", "", "，", "a", "", "", "你"]
    assert [e.start for e in c.tokens] == [0, 1, 2, 2, 2, 3, 4, 4, 4]
    assert [e.text for e in c.tokens][:6] == ["bytes:\\xbd", "bytes:\\xa0", "bytes:\\xef",
                                              "bytes:\\xbc", "bytes:\\x8c", "a"]
    assert list(c.tokens[5].top)[:2] == ["bytes:\\xe4", "bytes:\\xef"]


def test_a_full_queue_is_a_429():
    worker = Worker(max_queue=2)
    worker.start()
    gate = threading.Event()

    async def scenario():
        held = [worker.submit(lambda job: gate.wait(10)) for _ in range(2)]
        with pytest.raises(APIError) as e:
            worker.submit(lambda job: None)
        assert e.value.status == 429
        gate.set()
        for job in held:
            async for _ in worker.events(job):
                pass
        assert worker.outstanding == 0
        assert await worker.call(lambda job: 42) == 42

    try:
        asyncio.run(asyncio.wait_for(scenario(), 20))
    finally:
        gate.set()
        worker.stop()


def test_the_worker_runs_every_job_inside_its_scope():
    entered = []

    @contextlib.contextmanager
    def scope():
        entered.append("in")
        yield
        entered.append("out")

    worker = Worker(scope=scope)
    worker.start()

    async def scenario():
        return [await worker.call(lambda job: list(entered)) for _ in range(2)]

    try:
        seen = asyncio.run(asyncio.wait_for(scenario(), 20))
    finally:
        worker.stop()
    assert seen == [["in"], ["in"]] and entered == ["in", "out"]  # once, for every job


def test_a_scope_that_fails_to_open_still_serves(capfd):
    def scope():
        raise MemoryError("no room for the packed copies")

    worker = Worker(scope=scope)
    worker.start()
    try:
        assert asyncio.run(asyncio.wait_for(worker.call(lambda job: 42), 20)) == 42
    finally:
        worker.stop()
    assert "serving without the packed weights (MemoryError" in capfd.readouterr().err


@pytest.mark.parametrize("host,loop", [("127.0.0.1", True), ("127.3.4.5", True), ("::1", True),
                                       ("localhost", True), ("0.0.0.0", False),
                                       ("192.168.1.2", False), ("::", False),
                                       ("example.com", False)])
def test_loopback_hosts(host, loop):
    assert is_loopback(host) is loop


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve-cli") / "run"
    tokenizer = CharTokenizer.fit("abc ")
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=8, n_layer=1, n_head=1,
                    n_embd=8)
    meta = {"format": "minitransformer", "version": 1, "family": "gpt",
            "model": dataclasses.asdict(cfg), "data": {"source": "test"}}
    write_model_files(folder, GPT(cfg), meta, tokenizer)
    return folder


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_a_public_host_needs_a_key(run_dir, capsys):
    assert main(["serve", str(run_dir), "--host", "0.0.0.0"]) == 2
    assert "--api_key" in _error(capsys)
    # --insecure_no_key where there is nothing to be insecure about is an error, not ignored
    assert main(["serve", str(run_dir), "--insecure_no_key"]) == 2
    assert "--host 127.0.0.1 is loopback; drop it" in _error(capsys)
    assert main(["serve", str(run_dir), "--host", "0.0.0.0", "--api_key", "k",
                 "--insecure_no_key"]) == 2
    assert "--api_key is given; drop it" in _error(capsys)
    # a key no client can send (blank, spaces at its ends, not ASCII) is refused, not served
    for key in ("", " ", " k", "k\t", "clé"):
        assert main(["serve", str(run_dir), "--host", "0.0.0.0", "--api_key", key]) == 2
        assert "--api_key" in _error(capsys)


def test_missing_and_corrupt_run_folders(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "nothing")]) == 2
    _error(capsys)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json", encoding="utf-8")
    assert main(["serve", str(tmp_path / "bad")]) == 2
    _error(capsys)


def test_a_busy_port(run_dir, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert main(["serve", str(run_dir), "--port", str(port)]) == 2
    assert f"127.0.0.1:{port}" in _error(capsys)


def test_help_names_every_flag(capsys):
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--host", "--port", "--api_key", "--insecure_no_key", "--max_queue",
                 "--max_tokens", "--lang", "--which", "--device"):
        assert flag in out


@pytest.mark.parametrize("port", ["65536", "99999", "-1"])
def test_a_port_outside_0_to_65535_is_refused_by_the_flag(run_dir, port, capsys):
    assert main(["serve", str(run_dir), "--port", port]) == 2
    err = _error(capsys)
    assert "--port" in err and ("0 to 65535" in err or "negative" in err), err
    for edge in ("0", "65535"):  # the ends of the range parse
        assert build_parser().parse_args(["serve", "d", "--port", edge]).port == int(edge)


def test_offsets_follow_the_text_when_decoding_drops_a_leading_space():
    """A Llama-style tokenizer (SentencePiece pieces, byte fallback, a decoder that strips the
    first space): each token's offset is where its text begins in the completion, which
    keeps the space its first token begins with (what it adds to the prompt)."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    from minitransformer.tokenizers.bpe import BYTE_TOKENS, BPETokenizer

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for piece in (*BYTE_TOKENS, "\u2581", "\u2581the", "s", "a", "t", "h", "e", "c"):
        vocab[piece] = len(vocab)
    hf = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    hf.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                          normalizers.Replace(" ", "\u2581")])
    hf.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok = BPETokenizer(hf)
    ids = tok.encode("the cat你s")
    c = Choice(0, [])
    for i in ids:
        c.add(i, torch.log_softmax(torch.zeros(tok.vocab_size), 0), 1, tok)
    c.end(tok)
    text, entries = c.take()
    assert text == " the cat你s"
    for e in entries:
        if not e.text.startswith("bytes:") and e.text.strip():
            assert text[e.start:e.start + len(e.text)] == e.text, (e.text, e.start)
    assert [e.start for e in entries if e.text.startswith("bytes:")] == [8, 8, 8]


def test_starting_texts_come_from_the_corpus_else_a_prompt_the_model_reads(run_dir, tmp_path):
    from minitransformer.families import load_run
    from minitransformer.serve.playground import starting_texts

    run = load_run(run_dir)  # its corpus "test" is nowhere, its characters are "abc "
    assert starting_texts(run) == {}  # nothing it can read: the page keeps its own text
    (tmp_path / "abc.txt").write_text("\n  ab ca bc abc cab  \nccc\n", encoding="utf-8")
    run.meta["data"]["source"] = str(tmp_path / "abc.txt")
    assert starting_texts(run) == {"prompt": "ab ca bc abc cab",
                                   "masked": "ab ca bc abc ca[MASK]"}
    run.meta["data"]["source"] = "shakespeare"  # a bundled corpus whose characters it lacks
    assert starting_texts(run) == {}
    # a folder (its first file), JSON Lines and Parquet (the first record's text field): the
    # page once kept its own ROMEO:, which this model cannot read
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a.txt").write_text("ba ab\n", encoding="utf-8")
    (tmp_path / "folder" / "b.txt").write_text("cc\n", encoding="utf-8")
    (tmp_path / "r.jsonl").write_text('{"body": "cab ab"}\n{"body": "c"}\n', encoding="utf-8")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pytest.importorskip("pyarrow").table({"body": ["a b c", "b"]}),
                   tmp_path / "r.parquet")
    for source, field, line in (("folder", None, "ba ab"), ("r.jsonl", "body", "cab ab"),
                                ("r.parquet", "body", "a b c")):
        run.meta["data"]["source"] = str(tmp_path / source)
        run.meta["data"].pop("text_field", None)
        if field:
            run.meta["data"]["text_field"] = field
        assert starting_texts(run)["prompt"] == line


def test_the_walkthrough_tail_starts_at_a_whole_character():
    """Byte-level BPE splits Chinese characters between tokens: the last 64 tokens of a long
    text may begin inside one. The tail starts at the next whole character and fits."""
    from types import SimpleNamespace

    from minitransformer.data.text import load_text
    from minitransformer.serve.walkthrough import last_tokens
    from minitransformer.tokenizers.bpe import BPETokenizer

    text = load_text("sayings")[:20000]
    tok = BPETokenizer.train([text], 300, byte_level=True)
    run = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(block_size=256)),
                          tokenizer=tok)
    for n in (106, 150, 300, 1000):
        kept, dropped = last_tokens(run, text[:n])
        assert text[:n].endswith(kept) and "\ufffd" not in kept
        assert len(tok.encode(kept)) <= 64 and dropped > 0


def test_the_walkthrough_tail_reads_a_windows_line_end_as_a_prompt_does():
    """A character model without '\\r' reads a prompt's CRLF as '\\n'; the tail of a long
    text cut for the page did not, and came back whole and uncut."""
    from types import SimpleNamespace

    from minitransformer.serve.walkthrough import last_tokens
    from minitransformer.tokenizers.char import CharTokenizer

    run = SimpleNamespace(tokenizer=CharTokenizer.fit("ab\n"),
                          model=SimpleNamespace(config=SimpleNamespace(block_size=8)))
    assert last_tokens(run, "ab\r\n" * 10) == ("b\nab\nab\n", 22)  # 30 characters, 8 kept
