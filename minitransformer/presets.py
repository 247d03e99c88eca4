"""Named settings, one table per model family: ``minitransformer train --preset NAME``.

Each preset is a flat mapping of field -> value over the family's config classes and
``TrainConfig``; flags given on the command line win over it. The measurements behind
the CPU presets are in docs/BENCHMARKS.md.
"""

from __future__ import annotations

# max_iters of a run that its time budget ends: a cap no run reaches first, which train's
# header leaves out ("training for 600s", not "600s or 1,000,000 steps").
NO_STEP_CAP = 1_000_000

# What later models changed (docs/modern.md measures each): RMSNorm, RoPE, no biases,
# QK-norm, SwiGLU in the FFN (it beat ReLU^2 there), and Muon for the hidden matrices.
# ``<preset>-modern`` is ``<preset>`` with these.
MODERN = dict(norm="rmsnorm", pos_encoding="rope", bias=False, qk_norm=True,
              activation="swiglu", optimizer="muon")

GPT: dict[str, dict] = {
    # Seconds on a laptop: for tests and a first look.
    "debug": dict(n_layer=2, n_head=2, n_embd=64, block_size=32, batch_size=16,
                  max_iters=200, eval_interval=100, eval_iters=20, learning_rate=3e-3,
                  min_lr=3e-4, warmup_iters=20, weight_decay=0.0, sample_tokens=80),
    # About two minutes of training on 2 CPU cores (the `make demo` model), tuned by
    # 120-s runs on Tiny Shakespeare (docs/BENCHMARKS.md): in that time 3 layers beat 4
    # (more steps), ReLU (the paper's FFN) beats GELU, and batches of 32 at lr 5e-3 beat
    # 16 at 3e-3; val loss about 1.60 with bf16 autocast.
    "cpu-small": dict(n_layer=3, n_head=4, n_embd=128, block_size=64, batch_size=32,
                      max_iters=100_000, time_budget=120.0, eval_interval=500,
                      eval_iters=200, learning_rate=5e-3, min_lr=1e-4, warmup_iters=100,
                      beta2=0.99, weight_decay=0.1, dropout=0.0, activation="relu"),
    # Ten minutes on 2 CPU cores: a wider, deeper model with a longer context.
    "cpu-medium": dict(n_layer=4, n_head=6, n_embd=192, block_size=128, batch_size=32,
                       max_iters=NO_STEP_CAP, time_budget=600.0, eval_interval=1000,
                       eval_iters=200, learning_rate=3e-3, min_lr=1e-4, warmup_iters=100,
                       beta2=0.99, weight_decay=0.1, dropout=0.0, activation="relu"),
    # nanoGPT's shakespeare-char GPU config.
    "shakespeare-char": dict(n_layer=6, n_head=6, n_embd=384, block_size=256,
                             batch_size=64, dropout=0.2, max_iters=5000,
                             eval_interval=250, learning_rate=1e-3, min_lr=1e-4,
                             warmup_iters=100, beta2=0.99),
    # GPT-2 small: 124,439,808 parameters with vocab_size 50257 and tied weights.
    "gpt2-124m": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024,
                      vocab_size=50257, bias=True, tie_weights=True, dropout=0.0,
                      activation="gelu_tanh", pos_encoding="learned",
                      norm_position="pre", batch_size=8, learning_rate=6e-4,
                      min_lr=6e-5, warmup_iters=2000, max_iters=600_000,
                      weight_decay=0.1, beta2=0.95),
    # --init_from's default: training fields only (the model is the source's). A small
    # learning rate, a short warmup, cosine decay over a fixed number of steps.
    "finetune": dict(learning_rate=3e-4, min_lr=3e-5, warmup_iters=50, max_iters=1000,
                     lr_schedule="cosine", batch_size=16, eval_interval=100, eval_iters=50,
                     weight_decay=0.01, beta2=0.99, grad_clip=1.0),
}

# Each GPT preset but finetune gets its modern twin, listed after it. The ten-minute one
# takes batches of 48 and Muon's lr 0.03 (Muon's step costs the same at any batch size, and
# the longer run has steps to spare); at two minutes those measured no better than 32 and
# 0.02 (docs/BENCHMARKS.md).
TUNED_MODERN = {"cpu-medium": dict(batch_size=48, muon_lr=0.03)}
GPT = {key: value for name, preset in GPT.items() for key, value in
       [(name, preset)] + ([(f"{name}-modern", {**preset, **MODERN, **TUNED_MODERN.get(name, {})})]
                           if name != "finetune" else [])}

# The bidirectional encoder, trained as a masked language model (BERT's task #1).
ENCODER: dict[str, dict] = {
    # Seconds: for tests and a first look.
    "debug": dict(n_layer=2, n_head=2, n_embd=64, block_size=32, batch_size=32,
                  max_iters=200, eval_interval=100, eval_iters=20, learning_rate=3e-3,
                  min_lr=3e-4, warmup_iters=20, weight_decay=0.0, sample_tokens=32),
    # About two minutes of training on 2 CPU cores.
    "cpu-small": dict(n_layer=4, n_head=4, n_embd=128, block_size=128, batch_size=16,
                      max_iters=100_000, time_budget=120.0, eval_interval=500,
                      eval_iters=50, learning_rate=1e-3, min_lr=1e-4, warmup_iters=100,
                      weight_decay=0.01, beta2=0.999, sample_tokens=96),
    # BERT-base (Devlin et al. 2019, appendix A.2): 12 layers, 768 wide, 12 heads,
    # sequences of 512, dropout 0.1, Adam lr 1e-4 with 10,000 warmup steps, decay 0.01.
    "bert-base": dict(n_layer=12, n_head=12, n_embd=768, d_ff=3072, block_size=512,
                      type_vocab_size=2, dropout=0.1, batch_size=256, max_iters=NO_STEP_CAP,
                      learning_rate=1e-4, min_lr=0.0, warmup_iters=10_000,
                      weight_decay=0.01, beta1=0.9, beta2=0.999, eval_interval=2000),
    # --init_from's default (training fields only): continued masked-LM training at BERT's
    # fine-tuning scale of learning rate.
    "finetune": dict(learning_rate=1e-4, min_lr=1e-5, warmup_iters=50, max_iters=1000,
                     lr_schedule="cosine", batch_size=16, eval_interval=100, eval_iters=20,
                     weight_decay=0.01, beta2=0.999, grad_clip=1.0),
}

# The encoder-decoder. batch_tokens / train_max_len belong to data.ParallelDataConfig.
SEQ2SEQ: dict[str, dict] = {
    # Seconds: for tests and a first look (it will not translate well).
    "debug": dict(n_layer=2, n_head=2, n_embd=64, d_ff=128, vocab_size=1000, dropout=0.1,
                  batch_size=64, batch_tokens=1024, train_max_len=48, max_iters=100,
                  eval_interval=50, eval_iters=5, learning_rate=2e-3, min_lr=2e-4,
                  warmup_iters=20, weight_decay=0.0, beta2=0.98, sample_tokens=40),
    # 15 minutes of training on 2 CPU cores, sized for that budget (the runs that chose it
    # are in docs/BENCHMARKS.md): a small model, short length-grouped batches, no dropout.
    "cpu-small": dict(n_layer=3, n_head=4, n_embd=128, d_ff=512, vocab_size=4000,
                      dropout=0.0, batch_size=256, batch_tokens=1200, train_max_len=80,
                      max_iters=NO_STEP_CAP, time_budget=900.0, eval_interval=1000,
                      eval_iters=20, learning_rate=2e-3, min_lr=1e-4, warmup_iters=200,
                      weight_decay=0.0, beta1=0.9, beta2=0.98, grad_clip=1.0,
                      sample_tokens=60),
    # The paper's base model (sections 5.1-5.4): 6+6 layers, d_model 512, 8 heads,
    # d_ff 2048, dropout 0.1, label smoothing 0.1, Adam(0.9, 0.98), the noam schedule
    # with 4000 warmup steps, about 25,000 source + 25,000 target tokens per step.
    "base": dict(n_layer=6, n_head=8, n_embd=512, d_ff=2048, vocab_size=8000,
                 dropout=0.1, label_smoothing=0.1, batch_size=4096, batch_tokens=25000,
                 train_max_len=128, lr_schedule="noam", warmup_iters=4000,
                 max_iters=100_000, eval_interval=1000, eval_iters=50, beta1=0.9,
                 beta2=0.98, weight_decay=0.0, grad_clip=0.0, sample_tokens=80),
    # --init_from's default (training fields only).
    "finetune": dict(learning_rate=2e-4, min_lr=2e-5, warmup_iters=50, max_iters=2000,
                     lr_schedule="cosine", batch_size=256, eval_interval=200, eval_iters=20,
                     weight_decay=0.0, beta2=0.98, grad_clip=1.0),
}


def get_preset(presets: dict[str, dict], name: str, family: str = "") -> dict:
    """A copy of ``presets[name]``; an unknown name is a ConfigError naming the choices."""
    from .config import closest
    from .errors import ConfigError

    if name not in presets:
        raise ConfigError(f"unknown preset {name!r}{f' for {family}' if family else ''}"
                          f"{closest(name, presets)}; choose from {', '.join(presets)}")
    return dict(presets[name])


MUON_FIELDS = ("muon_lr", "muon_momentum")


def with_preset(preset: dict, given: dict) -> dict:
    """The preset's values overridden by the fields given; a modern preset's Muon settings
    are left out when ``--optimizer adamw`` replaces its optimizer (they would not apply,
    and only a Muon setting the user gives is an error then)."""
    merged = {**preset, **given}
    if merged.get("optimizer", "adamw") != "muon":
        for name in MUON_FIELDS:
            if name not in given:
                merged.pop(name, None)
    return merged
