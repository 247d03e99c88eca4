"""Shared fixtures: seeded randomness, tiny models, a tiny corpus, the CLI as a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

from minitransformer.config import GPTConfig
from minitransformer.models import GPT

# Tiny models on a small, shared machine: one intra-op thread is several times faster than two
# threads that wait for each other whenever another process holds a core (measured: a 40-step
# debug run took 4 s with one thread, 32 s with two, next to one busy process). Subprocesses
# inherit the variable; set OMP_NUM_THREADS yourself to override.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
_CACHE = tempfile.mkdtemp(prefix="minitransformer-cache-")  # see _cache below
os.environ["MINITRANSFORMER_CACHE"] = _CACHE

# A few KB of plain English: enough for the debug preset's context (32) in the 10% val split.
TINY_TEXT = "\n".join(
    f"Line {i}: the quick brown fox jumps over the lazy dog, and the cat sat on the mat. "
    f"To be, or not to be: that is the question {i % 7}."
    for i in range(40)
) + "\n"


@pytest.fixture(scope="session", autouse=True)
def _cache():
    """The implicit data cache lives in a temp folder for the session: no test writes to the
    home folder. It is set when this file is imported, before the test modules that copy
    os.environ for their subprocesses; removed at the end."""
    yield
    shutil.rmtree(_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same random state."""
    torch.manual_seed(0)


@pytest.fixture
def make_gpt():
    """Build a tiny GPT; ``scale`` redraws every weight ~ N(0, scale) so that logits are far
    from uniform (greedy decoding of a freshly initialised model barely varies)."""

    def build(scale: float | None = None, **overrides) -> GPT:
        fields = dict(vocab_size=13, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
        fields.update(overrides)
        model = GPT(GPTConfig(**fields))
        if scale is not None:
            with torch.no_grad():
                for p in model.parameters():
                    p.normal_(0.0, scale)
        return model.eval()

    return build


@pytest.fixture(scope="session")
def make_encoder():
    """Build an untrained masked-LM encoder on characters ([MASK] = one id past them), 1 layer
    x 16 wide: (model, tokenizer). ``scale`` redraws every weight ~ N(0, scale); ``folder``
    writes it there as a run folder."""
    import dataclasses

    from minitransformer.config import EncoderConfig
    from minitransformer.models import EncoderModel
    from minitransformer.tokenizers import CharTokenizer
    from minitransformer.training.checkpoint import write_model_files

    def build(chars: str, block_size: int = 8, scale: float | None = None, folder=None):
        tokenizer = CharTokenizer.fit(chars)
        torch.manual_seed(0)
        cfg = EncoderConfig(vocab_size=tokenizer.vocab_size + 1, mask_id=tokenizer.vocab_size,
                            block_size=block_size, n_layer=1, n_head=2, n_embd=16)
        model = EncoderModel(cfg)
        if scale is not None:
            with torch.no_grad():
                for p in model.parameters():
                    p.normal_(0.0, scale)
        if folder is not None:
            meta = {"format": "minitransformer", "version": 1, "family": "encoder",
                    "model": dataclasses.asdict(cfg), "data": {"source": "test"}}
            write_model_files(folder, model, meta, tokenizer)
        return model.eval(), tokenizer

    return build


@pytest.fixture(scope="session")
def small_llama():
    """make(vocab_size, seed) -> a small random LlamaForCausalLM (2 layers, 32 wide, 64
    positions, bos 1, eos 2), its weights N(0, 0.3) but the norms' (varied logits)."""
    transformers = pytest.importorskip("transformers")

    def make(vocab_size: int, seed: int):
        torch.manual_seed(seed)
        cfg = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=32,
                                       intermediate_size=48, num_hidden_layers=2,
                                       num_attention_heads=2, max_position_embeddings=64,
                                       bos_token_id=1, eos_token_id=2,
                                       attn_implementation="eager")
        model = transformers.LlamaForCausalLM(cfg).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" not in name:
                    p.normal_(0.0, 0.3)
        return model

    return make


@pytest.fixture(scope="session")
def tiny_text() -> str:
    return TINY_TEXT


@pytest.fixture
def tiny_corpus(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text(TINY_TEXT, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def run_cli():
    """Run ``python -m minitransformer ARGS`` in a fresh interpreter; returns CompletedProcess."""

    def run(*args: str, cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
        return subprocess.run([sys.executable, "-m", "minitransformer", *map(str, args)],
                              capture_output=True, text=True, encoding="utf-8", cwd=cwd,
                              env=env, timeout=timeout)

    return run


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (Debian's package, not a download) driven by playwright, one per test
    module (playwright's sync API keeps an event loop running while it is open, which
    asyncio.run in later tests must not find); tests that need it are skipped, saying why,
    where either is missing."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                                   "(it is in the test extra: pip install -e '.[test]')")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium executable: `make install` installs Debian's chromium with "
                    "apt-get; it could not be installed on this machine")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield b
        b.close()
