"""Parallel corpora for translation: reading, a split by whole chapters, length-bucketed batches.

Two input shapes:
- a TSV of sentence pairs, with or without a header; ``src`` / ``tgt`` pick the columns by
  header name or by 0-based index (defaults: the columns ``en`` and ``es`` of a header, or
  columns 0 and 1 of a two-column file). A header is a first line holding a column named by
  ``src`` / ``tgt``, or made of names only (language codes, 英文-style names, ref, id). A
  ``ref`` column (an OSIS reference such as ``Gen 1:1``) groups verses into chapters.
- two aligned text files, one sentence per line.

The split is deterministic and keeps whole chapters together (or, without refs, blocks of
consecutive lines), so that no test verse has its neighbours in training.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ConfigError, UserError
from .text import corpus_path

VALID_FRACTION = 0.03
TEST_FRACTION = 0.03
DEFAULT_SRC, DEFAULT_TGT = "en", "es"
# What a header's column names look like: a language code (en, zh, pt-BR), a language named
# in Chinese or Japanese (英文, 中文, 法语, 日本語), or one of the usual other columns.
_HEADER_WORD = re.compile(r"^([a-z]{2,3}([_-][A-Za-z]{2,4})?|ref|id|source|target|src|tgt"
                          r"|[\u4e00-\u9fff]{1,4}[文语語])$")


@dataclass
class ParallelDataConfig:
    """How a parallel corpus becomes training batches (the seq2seq presets set these too)."""

    src: str | None = None  # source column: header name or index (default en, or column 0)
    """source: TSV column name or 0-based index (default en, or column 0)"""
    tgt: str | None = None  # target column (default es, or column 1)
    """target: TSV column name or 0-based index (default es, or column 1)"""
    batch_tokens: int = 4096
    """about this many source (and target) tokens per batch, padding included"""
    train_max_len: int = 128
    """drop training pairs with a side longer than this many tokens"""

    def __post_init__(self):
        for name in ("batch_tokens", "train_max_len"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")


@dataclass
class ParallelCorpus:
    """Sentence pairs with a group key each (chapter, or block of lines) for the split."""

    name: str
    src_lang: str
    tgt_lang: str
    src: list[str]
    tgt: list[str]
    groups: list[str]

    def __len__(self) -> int:
        return len(self.src)

    def digest(self) -> str:
        """SHA-256 of the sentence pairs: the same pairs, however their files are named."""
        digest = hashlib.sha256()
        for src, tgt in zip(self.src, self.tgt, strict=True):
            digest.update(f"{src}\t{tgt}\n".encode("utf-8", "surrogatepass"))
        return digest.hexdigest()


def _read_lines(path: Path, shown: str, encoding: str) -> list[str]:
    try:
        text = path.read_text(encoding=encoding)
    except OSError as e:
        raise UserError(f"cannot read {shown}: {e.strerror}") from None
    except LookupError:
        raise UserError(f"unknown encoding {encoding!r}") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{shown} is not valid {encoding} (byte {e.start}); pass --encoding") \
            from None
    return text.removeprefix("\ufeff").splitlines()


def _column(spec: str, header: list[str] | None, shown: str, role: str) -> int:
    if spec.isdigit():
        return int(spec)
    if header is None or spec not in header:
        if header is None:
            hint = f"it has no header; give an index: --{role} {0 if role == 'src' else 1}"
        else:
            texts = [h for h in header if h.strip().lower() not in ("ref", "id")] or header
            pick = texts[0] if role == "src" or len(texts) == 1 else texts[1]
            hint = f"its header has {', '.join(header)}; name a column: --{role} {pick}"
        raise UserError(f"{shown}: no column named {spec!r} for the {role} ({hint})")
    return header.index(spec)


def _is_header(fields: list[str], src: str | None, tgt: str | None) -> bool:
    """Whether the first line names the columns: it holds a column named by --src / --tgt,
    or every field looks like a column name (then a name asked for that is not among them
    is an error that lists them, not a sign that there is no header)."""
    names = [s for s in (src, tgt) if s is not None and not s.isdigit()]
    if any(n in fields for n in names):
        return True
    return all(_HEADER_WORD.match(f.strip()) for f in fields)


def chapter_of(ref: str) -> str:
    """'Gen 1:1' -> 'Gen 1' (book and chapter); a ref without ':' is its own group."""
    return ref.rsplit(":", 1)[0] if ":" in ref else ref


def read_tsv(source: str, src: str | None = None, tgt: str | None = None,
             encoding: str = "utf-8") -> ParallelCorpus:
    """Read sentence pairs from a TSV (see the module docstring for the column rules)."""
    path, shown = corpus_path(source), source
    lines = _read_lines(path, shown, encoding)
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    if not numbered:
        raise UserError(f"{shown} is empty: no sentence pairs")
    first = numbered[0][1].split("\t")
    header = first if _is_header(first, src, tgt) else None
    if header is None and (src or tgt) is None and len(first) < 2:
        raise UserError(f"{shown}:{numbered[0][0]}: one column, not sentence pairs: an "
                        f"encoder-decoder reads source<TAB>target lines (train also takes the "
                        f"two sides as two files, --data and --data_tgt)")
    if header is None and (src or tgt) is None and len(first) != 2:
        raise UserError(f"{shown}:{numbered[0][0]}: {len(first)} columns and no header; say "
                        f"which to use: --src 0 --tgt 1")
    src_spec = src or (DEFAULT_SRC if header else "0")
    tgt_spec = tgt or (DEFAULT_TGT if header else "1")
    i_src = _column(src_spec, header, shown, "src")
    i_tgt = _column(tgt_spec, header, shown, "tgt")
    width = len(first)
    for i, role in ((i_src, "src"), (i_tgt, "tgt")):
        if i >= width:
            raise UserError(f"{shown}: --{role} {i} is past the last column ({width} columns)")
    if i_src == i_tgt:
        raise UserError(f"{shown}: source and target are the same column ({i_src})")
    i_ref = None
    if header is not None:
        i_ref = next((i for i, h in enumerate(header) if h.strip().lower() == "ref"), None)
    rows = numbered[1:] if header else numbered
    src_lang = header[i_src] if header else f"column {i_src}"
    tgt_lang = header[i_tgt] if header else f"column {i_tgt}"
    s_out, t_out, groups = [], [], []
    block = _block_size(len(rows))
    for k, (lineno, line) in enumerate(rows):
        fields = line.split("\t")
        if len(fields) != width:
            raise UserError(f"{shown}:{lineno}: expected {width} tab-separated columns, "
                            f"found {len(fields)}")
        s, t = fields[i_src].strip(), fields[i_tgt].strip()
        for text, lang in ((s, src_lang), (t, tgt_lang)):
            if not text:
                raise UserError(f"{shown}:{lineno}: the {lang} side is empty")
        s_out.append(s)
        t_out.append(t)
        groups.append(chapter_of(fields[i_ref].strip()) if i_ref is not None
                      else f"block {k // block}")
    if not s_out:
        raise UserError(f"{shown} has a header but no sentence pairs")
    return ParallelCorpus(source, src_lang, tgt_lang, s_out, t_out, groups)


def read_aligned(src_file: str, tgt_file: str, encoding: str = "utf-8") -> ParallelCorpus:
    """Two files with one sentence per line, line i of one translating line i of the other."""
    a = _read_lines(corpus_path(src_file), src_file, encoding)
    b = _read_lines(corpus_path(tgt_file), tgt_file, encoding)
    while a and b and not a[-1].strip() and not b[-1].strip():  # trailing blank lines
        a, b = a[:-1], b[:-1]
    if len(a) != len(b):
        (short, n_short), (long_, n_long) = sorted([(src_file, len(a)), (tgt_file, len(b))],
                                                   key=lambda x: x[1])
        raise UserError(f"{short}:{n_short + 1}: the file ends here, but {long_} goes on to "
                        f"line {n_long}; the two files must be aligned line by line")
    for lines, name in ((a, src_file), (b, tgt_file)):
        _refuse_pairs(lines, name)
    s_out, t_out, groups = [], [], []
    block = _block_size(len(a))
    for i, (s, t) in enumerate(zip(a, b, strict=True)):
        s, t = s.strip(), t.strip()
        if not s and not t:
            continue
        for text, name in ((s, src_file), (t, tgt_file)):
            if not text:
                raise UserError(f"{name}:{i + 1}: empty line, but the other file has a "
                                f"sentence there")
        s_out.append(s)
        t_out.append(t)
        groups.append(f"block {i // block}")
    if not s_out:
        raise UserError(f"{src_file} and {tgt_file} hold no sentences")
    return ParallelCorpus(f"{src_file} + {tgt_file}", *_sides(src_file, tgt_file), s_out,
                          t_out, groups)


def _refuse_pairs(lines: list[str], name: str) -> None:
    """A UserError where most of a file's lines hold a tab between two texts: a TSV of
    source<TAB>target pairs given as one of two aligned files (each line would be read whole
    as one sentence). A tab here and there stays part of its sentence."""
    filled = [i for i, line in enumerate(lines) if line.strip()]
    pairs = [i for i in filled if len([f for f in lines[i].split("\t") if f.strip()]) >= 2]
    if pairs and len(pairs) * 2 > len(filled):
        raise UserError(f"{name}:{pairs[0] + 1}: {len(pairs):,} of its {len(filled):,} lines "
                        f"hold a tab between two texts, as a TSV of source<TAB>target pairs "
                        f"does: give such a file alone as --data, without --data_tgt")


def _sides(src_file: str, tgt_file: str) -> tuple[str, str]:
    """What the two sides are called: their suffixes where the names differ only there (the
    usual train.en and train.es), else each file's name without its suffix."""
    a, b = Path(src_file), Path(tgt_file)
    if a.stem == b.stem and a.suffix and b.suffix and a.suffix != b.suffix:
        return a.suffix[1:], b.suffix[1:]
    return a.stem, b.stem


def _block_size(n: int) -> int:
    """Lines per block when a corpus has no refs: 100, smaller for small corpora."""
    return max(1, min(100, n // 100))


def load_parallel(source: str, source_tgt: str | None = None, src: str | None = None,
                  tgt: str | None = None, encoding: str = "utf-8") -> ParallelCorpus:
    """A TSV (bundled name or path), or two aligned files when ``source_tgt`` is given."""
    if source_tgt:
        if src or tgt:
            raise UserError("--src / --tgt pick TSV columns; with two files, the first is "
                            "the source and the second the target")
        return read_aligned(source, source_tgt, encoding)
    return read_tsv(source, src, tgt, encoding)


def split_indices(groups: list[str], valid_fraction: float = VALID_FRACTION,
                  test_fraction: float = TEST_FRACTION) -> dict[str, list[int]]:
    """Deterministic train / valid / test split by whole groups (chapters).

    Groups are ordered by a checksum of their name (a fixed pseudo-random order that does not
    depend on Python's hash seed); the first ones fill the test split up to test_fraction of
    the pairs, the next ones valid, the rest is training.
    """
    members: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    order = sorted(members, key=lambda g: (zlib.crc32(g.encode("utf-8")), g))
    n = len(groups)
    out: dict[str, list[int]] = {"test": [], "valid": [], "train": []}
    for g in order:
        if len(out["test"]) < test_fraction * n:
            out["test"] += members[g]
        elif len(out["valid"]) < valid_fraction * n:
            out["valid"] += members[g]
        else:
            out["train"] += members[g]
    for name in out:
        out[name].sort()
    if not out["train"] or not out["valid"]:
        raise UserError(f"the corpus is too small to split ({n} pairs in {len(members)} "
                        f"groups): it needs at least 3 groups")
    return out


def source_ids(tokenizer, texts: list[str], eos_id: int, limit: int | None = None):
    """Source sentences as the encoder reads them: ids (at most ``limit``) then </s>, so the
    encoder sees where the sentence ends. Training, translation and the views all use this."""
    return [(ids[:limit] if limit else ids) + [eos_id] for ids in tokenizer.encode_batch(texts)]


def encode_pairs(tokenizer, src: list[str], tgt: list[str], eos_id: int):
    """Token ids: sources end with </s>; targets are bare (the task adds <s> in front for the
    decoder input and </s> at the end)."""
    return source_ids(tokenizer, src, eos_id), tokenizer.encode_batch(tgt)


def bucket_batches(src_lens: list[int], tgt_lens: list[int], max_sentences: int,
                   max_tokens: int, seed: int = 0) -> list[list[int]]:
    """Group pairs of similar length so batches carry little padding.

    Pairs are sorted by (source length, target length), ties in a fixed random order, and cut
    into batches of at most ``max_sentences`` pairs and at most ``max_tokens`` padded positions
    per side (rows x longest sentence). Returns lists of pair indices.
    """
    gen = torch.Generator().manual_seed(seed)
    tie = torch.randperm(len(src_lens), generator=gen).tolist()
    order = sorted(range(len(src_lens)), key=lambda i: (src_lens[i], tgt_lens[i], tie[i]))
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        need = max(longest, src_lens[i], tgt_lens[i] + 1)
        if cur and (len(cur) + 1 > max_sentences or (len(cur) + 1) * need > max_tokens):
            batches.append(cur)
            cur, need = [], max(src_lens[i], tgt_lens[i] + 1)
        cur.append(i)
        longest = need
    if cur:
        batches.append(cur)
    return batches


def collate(src_ids: list[list[int]], tgt_ids: list[list[int]], pad_id: int, bos_id: int,
            eos_id: int):
    """(src (B, S), tgt_in (B, T), tgt_out (B, T)) right-padded with pad_id:
    tgt_in = <s> y_1 .. y_n, tgt_out = y_1 .. y_n </s> (teacher forcing)."""
    b = len(src_ids)
    s_len = max(len(s) for s in src_ids)
    t_len = max(len(t) for t in tgt_ids) + 1
    src = torch.full((b, s_len), pad_id, dtype=torch.long)  # (B, S)
    tgt_in = torch.full((b, t_len), pad_id, dtype=torch.long)  # (B, T)
    tgt_out = torch.full((b, t_len), pad_id, dtype=torch.long)  # (B, T)
    for i, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True)):
        src[i, :len(s)] = torch.tensor(s, dtype=torch.long)
        tgt_in[i, :len(t) + 1] = torch.tensor([bos_id] + t, dtype=torch.long)
        tgt_out[i, :len(t) + 1] = torch.tensor(t + [eos_id], dtype=torch.long)
    return src, tgt_in, tgt_out
