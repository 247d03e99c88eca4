"""Token ids of text pieces, in worker processes, handed back in input order.

    pieces (UTF-8 bytes) -> EncoderPool.map -> (ids, id counts) per piece, in the order given

A worker is a fresh Python running this file alone (``python -c`` loads it by path): it
imports numpy, ``tokenizers`` and ``tiktoken``, not the package (torch), so each holds tens
of megabytes, not the parent's hundreds. The parent sends a piece down a pipe to worker
``i % N`` and reads result ``i`` back from it; a writer thread per worker keeps the parent
from blocking on a full pipe, and at most ``2 N`` pieces are in flight, so memory is bounded
whatever the corpus size. A worker that loses its parent reads end-of-file and exits.

Three encoders, all giving the ids of the tokenizer itself:

- char: a code-point array looked up in a table (``lut[points]``), no Python loop per character;
- tiktoken: byte-level BPE rebuilt from our trained merges (``tiktoken_ranks``). tiktoken
  merges a pair whenever the joined bytes are a token, where ``tokenizers`` merges only pairs
  in its merge list, so it is used only where the structure checks out here and the ids
  agree with ``tokenizers`` on a probe text (``choose_encoder``); else
- tokenizers: the Hugging Face tokenizer, one piece at a time.

Pieces come cut where the tokenizer's pre-tokenizer cuts anyway (``pieces.py``), so encoding
the pieces gives the ids of the whole text.

This module imports nothing from the package: keep it so (the worker runs it alone).
"""

from __future__ import annotations

import json
import os
import queue
import struct
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Iterable, Iterator

import numpy as np

# GPT-2's pre-tokenizer pattern: what tokenizers' ByteLevel(use_regex=True) splits with
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# a probe beside the corpus's own head: contractions, digits, runs of spaces, CJK, the specials
PROBE = ("I'm sure it's 2024... they'll've   gone;\n\n  \t x  \r\n'S'T 3.14159 $5 "
         "naïve café 从前有座山，山里有座庙。 ЖЖЖ 🎉🎉 a\u00a0b\u3000c\n\n\n")
_HEADER = struct.Struct("<Q")


class EncodeError(Exception):
    """A piece could not be encoded (a worker's message); the caller makes it a user error."""


# ---- the encoders (run in the workers, or in-process for one worker) --------------------------

def _gpt2_bytes() -> dict[str, int]:
    """GPT-2's printable stand-in character of each byte -> the byte (as tokenizers has it)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[chr(b)] = b
        else:
            out[chr(256 + extra)] = b
            extra += 1
    return out


def tiktoken_ranks(hf: dict) -> tuple[dict[bytes, int], dict[str, int]] | None:
    """(mergeable ranks, special tokens) of a byte-level BPE tokenizer.json for tiktoken, or
    None where its structure lets tiktoken differ (a normalizer, another pre-tokenizer, ids
    out of merge order, a token no merge makes)."""
    model, pre = hf.get("model") or {}, hf.get("pre_tokenizer") or {}
    if hf.get("normalizer") is not None or pre.get("type") != "ByteLevel" or \
            pre.get("add_prefix_space") or not pre.get("use_regex", True) or \
            model.get("type") != "BPE" or model.get("dropout") or model.get("byte_fallback") or \
            model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return None
    added = hf.get("added_tokens") or []
    if any(not t.get("special") or t.get("lstrip") or t.get("rstrip") or t.get("single_word")
           for t in added):
        return None
    specials = {t["content"]: t["id"] for t in added}
    table, vocab = _gpt2_bytes(), model["vocab"]
    ranks: dict[bytes, int] = {}
    for token, i in vocab.items():
        if token in specials:
            continue
        if any(ch not in table for ch in token):
            return None
        ranks[bytes(table[ch] for ch in token)] = i
    merges = [m.split(" ") if isinstance(m, str) else m for m in model.get("merges", [])]
    made = [vocab.get(a + b) for a, b in merges]
    singles = sum(len(b) == 1 for b in ranks)
    if singles != 256 or len(ranks) != len(vocab) - sum(t in vocab for t in specials) or \
            None in made or made != sorted(set(made)) or len(made) != len(ranks) - 256:
        return None
    return ranks, specials


def build_tiktoken(hf: dict):
    """A tiktoken Encoding with our tokenizer's ids, or None (no tiktoken, or not eligible)."""
    try:
        import tiktoken
    except ImportError:
        return None
    parts = tiktoken_ranks(hf)
    if parts is None:
        return None
    ranks, specials = parts
    return tiktoken.Encoding("minitransformer", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens=specials)


def make_encoder(spec: dict):
    """piece (UTF-8 bytes, or a str) -> ids (np.ndarray of spec["dtype"]) for a spec."""
    dtype = np.dtype(spec["dtype"])
    if spec["kind"] == "char":
        return _char_encoder(spec["chars"], dtype)
    if spec["kind"] == "tiktoken":
        enc = build_tiktoken(json.loads(spec["json"]))
        if enc is None:
            raise EncodeError("tiktoken cannot take this tokenizer")
        return lambda piece: np.array(enc.encode(_text(piece), allowed_special="all"),
                                      dtype=dtype)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(spec["json"])
    return lambda piece: np.array(tok.encode(_text(piece), add_special_tokens=False).ids,
                                  dtype=dtype)


def _text(piece: bytes | str) -> str:
    if isinstance(piece, str):
        return piece
    try:
        return piece.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as e:
        raise EncodeError(f"a piece is not UTF-8 at its byte {e.start} (did a source change "
                          f"while it was prepared?)") from None


def _char_encoder(chars: list[str], dtype):
    """A table over every code point (its id, or a sentinel for characters not in ``chars``),
    indexed by the piece's code points: its Latin-1 bytes when it is ASCII (CPython knows
    that without a scan), else its UTF-32. ``piece``: UTF-8 bytes or a str."""
    small = len(chars) < (1 << 16) - 1  # then no id reaches the sentinel
    sentinel = (1 << 16) - 1 if small else (1 << 32) - 1
    lut = np.full(0x110000, sentinel, dtype=np.uint16 if small else np.uint32)
    lut[[ord(c) for c in chars]] = np.arange(len(chars))

    def encode_chars(piece: bytes | str) -> np.ndarray:
        if piece.isascii():  # one byte per character (O(1) for a str)
            points = np.frombuffer(piece if isinstance(piece, bytes) else piece.encode("ascii"),
                                   dtype=np.uint8)
        else:
            points = np.frombuffer(_text(piece).encode("utf-32-le", "surrogatepass"),
                                   dtype=np.uint32)
        ids = np.take(lut, points)  # twice lut[points]'s speed here
        if ids.size and int(ids.max()) == sentinel:
            unseen = chr(int(points[np.argmax(ids == sentinel)]))
            raise EncodeError(f"the text has a character the tokenizer never saw: {unseen!r}")
        return ids.astype(dtype, copy=False)
    return encode_chars


def make_counting_encoder(spec: dict):
    """piece -> (ids, how often each id occurs (V,) int64), for an encoder spec."""
    encode, vocab = make_encoder(spec), spec["vocab_size"]

    def encode_and_count(piece: bytes | str) -> tuple[np.ndarray, np.ndarray]:
        ids = encode(piece)
        return ids, np.bincount(ids, minlength=vocab)[:vocab]
    return encode_and_count


def choose_encoder(spec: dict, probe: str) -> tuple[dict, str]:
    """(the fastest spec giving the tokenizer's ids, a line saying which): a "bpe" spec becomes
    "tiktoken" where tiktoken is eligible and agrees with tokenizers on ``probe``, else "hf"."""
    if spec["kind"] != "bpe":
        return spec, "characters: a table lookup"
    hf_spec = {**spec, "kind": "hf"}
    if build_tiktoken(json.loads(spec["json"])) is None:
        return hf_spec, "BPE through tokenizers (tiktoken cannot take this tokenizer)"
    fast = {**spec, "kind": "tiktoken"}
    text = probe + PROBE
    if np.array_equal(make_encoder(fast)(text), make_encoder(hf_spec)(text)):
        return fast, f"BPE through tiktoken (ids equal to tokenizers' on {len(text):,} chars)"
    return hf_spec, "BPE through tokenizers (tiktoken's ids differ on the probe text)"


def encoder_spec(tokenizer) -> dict:
    """What a worker needs to encode with ``tokenizer`` (see encode.make_encoder)."""
    dtype = "uint16" if tokenizer.vocab_size <= 1 << 16 else "uint32"  # as shards.py stores
    if tokenizer.kind == "char":
        return {"kind": "char", "chars": tokenizer.chars, "dtype": dtype,
                "vocab_size": tokenizer.vocab_size}
    return {"kind": "bpe", "json": tokenizer.hf.to_str(), "dtype": dtype,
            "vocab_size": tokenizer.vocab_size}


# ---- the worker side ------------------------------------------------------------------------

def _read_frame(stream) -> bytes | None:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    n = _HEADER.unpack(head)[0]
    data = stream.read(n)
    return data if len(data) == n else None


def _write_frame(stream, data: bytes) -> None:
    stream.write(_HEADER.pack(len(data)))
    stream.write(data)
    stream.flush()


def serve(stdin=None, stdout=None) -> None:
    """A worker's loop: a spec frame, then piece frames in, b"K" + ids or b"E" + message out."""
    stdin, stdout = stdin or sys.stdin.buffer, stdout or sys.stdout.buffer
    frame = _read_frame(stdin)
    if frame is None:
        return
    try:
        encode = make_counting_encoder(json.loads(frame))
        _write_frame(stdout, b"K")
    except Exception as e:  # noqa: BLE001 - the parent reports it
        _write_frame(stdout, b"E" + str(e).encode("utf-8", "replace"))
        return
    while (frame := _read_frame(stdin)) is not None:
        try:
            ids, counts = encode(frame)
            out = b"K" + counts.astype("<i8").tobytes() + ids.tobytes()
        except Exception as e:  # noqa: BLE001
            out = b"E" + str(e).encode("utf-8", "replace")
        _write_frame(stdout, out)


# ---- the parent side ------------------------------------------------------------------------

# A worker ignores Ctrl-C (SIGINT reaches every process of the terminal's group): the parent
# stops, closes the pipes, and the worker, reading end-of-file, exits without a traceback.
_BOOT = ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
         "import sys, importlib.util as u; sys.path.pop(0); "
         "s = u.spec_from_file_location('minitransformer_encode_worker', sys.argv[1]); "
         "m = u.module_from_spec(s); s.loader.exec_module(m); m.serve()")


def _widen(stream, size: int = 1 << 20) -> None:
    """A pipe of ``size`` bytes instead of 64 KB: fewer wake-ups per piece (Linux only)."""
    try:
        import fcntl

        fcntl.fcntl(stream.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), size)
    except (ImportError, OSError):
        pass


class _Worker:
    """One worker process and the thread that feeds its pipe."""

    def __init__(self, spec: dict):
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1",
               "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-c", _BOOT, os.path.abspath(__file__)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        for stream in (self.proc.stdin, self.proc.stdout):
            _widen(stream)
        self.todo: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._feed, daemon=True)
        self.thread.start()
        self.todo.put(json.dumps(spec).encode("utf-8"))

    def _feed(self) -> None:
        try:
            while (data := self.todo.get()) is not None:
                _write_frame(self.proc.stdin, data)
        except (BrokenPipeError, OSError):
            pass  # the worker died: read() says so

    def send(self, piece: bytes) -> None:
        self.todo.put(piece)

    def read(self) -> bytes:
        frame = _read_frame(self.proc.stdout)
        if frame is None:
            raise EncodeError(f"an encoding worker stopped (exit code {self.proc.poll()})")
        if frame[:1] == b"E":
            raise EncodeError(frame[1:].decode("utf-8", "replace"))
        return frame[1:]

    def close(self, kill: bool = False) -> None:
        if kill:
            self.proc.kill()
        self.todo.put(None)
        self.thread.join(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class EncoderPool:
    """``map(pieces)``: (ids, id counts) of each piece, in input order, encoded by ``workers``
    processes (in this process when ``workers`` is 1); at most ``2 * workers`` in flight."""

    def __init__(self, spec: dict, workers: int = 1):
        self.spec, self.dtype, self.vocab = spec, np.dtype(spec["dtype"]), spec["vocab_size"]
        self.workers = [_Worker(spec) for _ in range(workers)] if workers > 1 else []

    def __enter__(self) -> EncoderPool:
        try:
            for w in self.workers:
                w.read()  # the worker built its encoder (or says why not)
        except BaseException:
            self.__exit__(EncodeError, None, None)
            raise
        return self

    def __exit__(self, exc_type, *exc) -> None:
        for w in self.workers:
            w.close(kill=exc_type is not None)

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers]

    def _result(self, frame: bytes) -> tuple[np.ndarray, np.ndarray]:
        cut = 8 * self.vocab
        return (np.frombuffer(frame, dtype=self.dtype, offset=cut),
                np.frombuffer(frame[:cut], dtype="<i8"))

    def map(self, pieces: Iterable[bytes]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        if not self.workers:
            yield from map(make_counting_encoder(self.spec), pieces)
            return
        n, window, pending = len(self.workers), 2 * len(self.workers), deque()
        for i, piece in enumerate(pieces):
            if len(pending) >= window:
                yield self._result(self.workers[pending.popleft()].read())
            self.workers[i % n].send(piece)
            pending.append(i % n)
        while pending:
            yield self._result(self.workers[pending.popleft()].read())
