"""The implicit cache: where it is, what keys it, and clearing it."""

from __future__ import annotations

from pathlib import Path

from minitransformer.data.cache import cache_dir, cache_root, clear_cache

FP = [{"path": "/a/b.txt", "bytes": 3, "sha256": "00" * 32}]


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MINITRANSFORMER_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    monkeypatch.delenv("MINITRANSFORMER_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "minitransformer"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == Path.home() / ".cache" / "minitransformer"


def test_every_part_of_the_key_moves_the_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("MINITRANSFORMER_CACHE", str(tmp_path))
    tok, fam = {"kind": "char"}, {"name": "gpt", "special": []}
    base = cache_dir(FP, tok, fam, 1)
    assert base == cache_dir([dict(FP[0])], dict(tok), dict(fam), 1)  # stable
    assert base.parent == tmp_path / "tokens"
    changed = [cache_dir([{**FP[0], "sha256": "11" * 32}], tok, fam, 1),
               cache_dir(FP, {"kind": "bpe", "vocab_size": 300}, fam, 1),
               cache_dir(FP, tok, {"name": "encoder", "special": ["<mask>"]}, 1),
               cache_dir(FP, tok, fam, 2)]
    assert len({base, *changed}) == 5


def test_clear_cache_removes_it_and_says_what_it_freed(monkeypatch, tmp_path):
    monkeypatch.setenv("MINITRANSFORMER_CACHE", str(tmp_path / "c"))
    lines: list[str] = []
    assert clear_cache(lines.append) == 0 and "nothing to remove" in lines[-1]
    folder = tmp_path / "c" / "tokens" / "k"
    folder.mkdir(parents=True)
    (folder / "tokens.bin").write_bytes(b"\0" * 2_000_000)
    assert clear_cache(lines.append) == 2_000_000
    assert not (tmp_path / "c").exists() and "2.0 MB freed" in lines[-1]
