"""LoRA: low-rank adapters on chosen linear layers, through Hugging Face ``peft``.

Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", eq. 3: a frozen
projection W (out x in) gains a trainable update of rank r,

    h = W x + (alpha / r) B A x        A: (r, in), B: (out, r); B starts at zero

so a target adds r * (in + out) trainable parameters and every other weight stays frozen.
``peft`` wraps each target (our ``nn.Linear`` subclass, ``nn/linear.py``) in place: the
model keeps its class, and only the wrapped layers' state-dict names change
(``q_proj.weight`` -> ``q_proj.base_layer.weight`` + ``q_proj.lora_A.default.weight`` ...).

What a LoRA run writes:

    RUN/model.safetensors           W' = W + (alpha / r) B A merged into a copy: plain
                                    weights that load without peft
    RUN/adapter_config.json,        the adapter alone in PEFT's format, when
        adapter_model.safetensors   --lora_save_adapter is on
    checkpoints/step_N/model.safetensors      merged too (a loadable model, as always), and
    checkpoints/step_N/lora_state.safetensors the frozen W, b of each target and its A, B:
                                    with the merged file, the live model that resume needs
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from ..errors import ConfigError, UserError
from ..io import atomic_write, atomic_write_json, load_tensors, read_safetensors
from .checkpoint import MODEL_FILE

LORA_STATE = "lora_state.safetensors"  # in each checkpoint folder
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)  # in the run folder, with --lora_save_adapter
ADAPTER = "default"  # peft's name for the one adapter
PEFT_PREFIX = "base_model.model."  # the key prefix of PEFT's saved adapters


# Llama's module names (what peft users pass as target_modules) -> ours, same matrices
LLAMA_NAMES = {"o_proj": "out_proj", "up_proj": "fc", "down_proj": "proj", "gate_proj": "gate"}


@dataclass
class LoraConfig:
    """Low-rank adapters on named linear layers; every other weight stays frozen."""

    lora_rank: int
    """LoRA: rank r of each adapter, a positive number; without this flag every weight
    trains"""
    lora_alpha: float | None = None
    """LoRA: the update is (alpha / r) B A (default alpha = r, a scale of 1)"""
    lora_targets: str = "q_proj,v_proj"
    """LoRA: comma-separated module names to adapt; a name matches every module whose dotted
    path ends with it (q_proj, k_proj, v_proj, out_proj, fc, proj, gate; or a full path such
    as decoder.layers.0.self_attn.q_proj; Llama's o_proj, up_proj, down_proj and gate_proj,
    as peft names them, mean out_proj, fc, proj and gate); a head tied to the embedding cannot
    be one"""
    lora_dropout: float = 0.0
    """LoRA: dropout on the adapters' input (0 = none)"""
    lora_save_adapter: bool = False
    """LoRA: also write the adapter alone in PEFT's format (adapter_config.json +
    adapter_model.safetensors) beside each best model"""

    def __post_init__(self):
        if self.lora_rank <= 0:
            raise ConfigError(f"--lora_rank must be a positive rank, got {self.lora_rank} "
                              f"(leave LoRA out to train every weight)")
        if self.lora_alpha is None:
            self.lora_alpha = float(self.lora_rank)
        if not self.lora_alpha > 0:
            raise ConfigError(f"--lora_alpha must be positive, got {self.lora_alpha}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ConfigError(f"--lora_dropout must be in [0, 1), got {self.lora_dropout}")
        self.lora_targets = ",".join(self.targets())
        if not self.lora_targets:
            raise ConfigError("--lora_targets names no module")

    def targets(self) -> list[str]:
        """The names given, Llama's (``LLAMA_NAMES``) as ours, each once."""
        out = []
        for target in (t.strip() for t in self.lora_targets.split(",")):
            head, dot, last = target.rpartition(".")
            out.append(head + dot + LLAMA_NAMES.get(last, last))
        return list(dict.fromkeys(t for t in out if t))


def settings(given: dict, saved: dict | None = None, resume: bool = False) -> LoraConfig | None:
    """The LoRA settings of a run, or None: ``given`` holds the --lora_* flags given, ``saved``
    the ``lora`` entry of a resumed run's config.json (None if it trained without LoRA)."""
    flags = ", ".join(f"--{k}" for k in given)
    if resume:
        if saved is None:
            if given:
                raise UserError(f"--resume keeps the run's settings and it was trained "
                                f"without LoRA; drop {flags}")
            return None
        try:
            out = LoraConfig(**saved)
        except TypeError as e:
            raise UserError(f"the run's config.json has a damaged lora entry ({e})") from None
        for key, value in given.items():  # only the adapter's output may change
            if key != "lora_save_adapter" and getattr(LoraConfig(**{**saved, key: value}),
                                                      key) != getattr(out, key):
                raise UserError(f"--resume keeps the run's LoRA settings; --{key} differs "
                                f"from the checkpoint ({getattr(out, key)})")
        return dataclasses.replace(out, **{k: v for k, v in given.items()
                                          if k == "lora_save_adapter"})
    if not given:
        return None
    if "lora_rank" not in given:
        raise UserError(f"{flags} need(s) --lora_rank (LoRA is off without it)")
    return LoraConfig(**given)


def _peft():
    try:
        import peft
    except ImportError:
        raise UserError("LoRA needs the peft package: pip install 'minitransformer[lora]'") \
            from None
    return peft


def matches(name: str, target: str) -> bool:
    """peft's rule for a list of target names: the module's dotted path is it or ends in it."""
    return name == target or name.endswith("." + target)


def short_name(path: str) -> str:
    """The shortest target that names a layer: its own name, with its container's where the
    name is an index (BERT's head ``mlm_head.transform.0``: ``transform.0``, not ``0``)."""
    parts = path.split(".")
    return ".".join(parts[-2:]) if parts[-1].isdigit() and len(parts) > 1 else parts[-1]


def find_targets(model: nn.Module, cfg: LoraConfig) -> dict[str, nn.Linear]:
    """The modules the targets name (path -> layer); a name that matches nothing, a module
    that is not a linear layer, or one whose weight is shared (tied) is a UserError."""
    modules = dict(model.named_modules())
    linear = sorted({short_name(n) for n, m in modules.items() if isinstance(m, nn.Linear)})
    uses = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        uses[id(p)] = uses.get(id(p), 0) + 1
    found = {}
    for target in cfg.targets():
        hits = {n: m for n, m in modules.items() if n and matches(n, target)}
        if not hits:
            raise UserError(f"--lora_targets {target} matches no module of this model; its "
                            f"linear layers are named {', '.join(linear)}")
        for name, module in hits.items():
            if not isinstance(module, nn.Linear):
                raise UserError(f"--lora_targets {target}: {name} is a "
                                f"{type(module).__name__}, not a linear layer; name linear "
                                f"layers ({', '.join(linear)})")
            if uses[id(module.weight)] > 1:
                raise UserError(f"--lora_targets {target}: {name}'s weight is tied to the "
                                f"token embedding (tie_weights), and a shared matrix cannot "
                                f"take an adapter; leave it out")
        found.update(hits)
    return found


class Lora:
    """A model with LoRA adapters injected in place (``self.model`` is the model trained) and
    what the trainer asks of it: the merged weights to save, the state to resume."""

    def __init__(self, model: nn.Module, cfg: LoraConfig):
        peft = _peft()
        self.cfg = cfg
        self.targets = find_targets(model, cfg)
        self.shapes = {n: (m.in_features, m.out_features) for n, m in self.targets.items()}
        self.peft_config = peft.LoraConfig(
            r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
            target_modules=cfg.targets(), bias="none")
        # LoraModel injects the adapters into ``model`` itself and freezes the rest
        self.tuner = peft.LoraModel(model, self.peft_config, ADAPTER)
        self.model = model
        wrapped = set(self.tuner.targeted_module_names)
        if wrapped != set(self.targets):  # the two matching rules must agree
            raise RuntimeError(f"peft adapted {sorted(wrapped)}, expected {sorted(self.targets)}")

    # ---- counts ------------------------------------------------------------------------

    def trainable(self) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def expected_trainable(self) -> int:
        """sum over targets of r * (in + out): A is (r, in), B is (out, r)."""
        return sum(self.cfg.lora_rank * (i + o) for i, o in self.shapes.values())

    def summary(self) -> str:
        n = self.trainable()
        frozen = sum(p.numel() for p in self.model.parameters()) - n
        return (f"LoRA rank {self.cfg.lora_rank}, alpha {self.cfg.lora_alpha:g} on "
                f"{len(self.targets)} linear layers ({self.cfg.lora_targets}): {n:,} parameters "
                f"train ({100 * n / frozen:.2f}% of the {frozen:,} frozen)")

    # ---- saving ------------------------------------------------------------------------

    def merged_state(self) -> dict[str, torch.Tensor]:
        """The plain model's state dict, as saved: W + (alpha / r) B A in each target's
        weight, every other tensor the live one (no copy of the model). The live model stays
        wrapped."""
        state = {k: t for k, t in self.model.state_dict().items() if not self.own(k)}
        with torch.no_grad():
            for name in self.targets:
                layer = self.model.get_submodule(name)  # peft's wrapper around the Linear
                base = layer.get_base_layer()
                state[f"{name}.weight"] = base.weight + layer.get_delta_weight(ADAPTER)
                if base.bias is not None:
                    state[f"{name}.bias"] = base.bias
        return state

    def merge_in_place(self) -> nn.Module:
        """Fold the adapters into their weights and drop the wrappers: the plain model, once
        training is over (the same values as ``merged_state``)."""
        return self.tuner.merge_and_unload()

    def own(self, key: str) -> bool:
        """Whether a state-dict key belongs to a wrapped layer (frozen W, b or A, B)."""
        return any(key.startswith(name + ".") for name in self.targets)

    def checkpoint_files(self) -> dict[str, dict[str, torch.Tensor]]:
        """What resume needs beyond the merged weights: each target's W, b, A and B."""
        return {LORA_STATE: {k: t.detach().to("cpu").contiguous()
                             for k, t in self.model.state_dict().items() if self.own(k)}}

    def load(self, folder: Path) -> None:
        """Restore the live (wrapped) model from a checkpoint folder written with it."""
        folder = Path(folder)
        if not (folder / LORA_STATE).exists():
            raise UserError(f"{folder} has no {LORA_STATE}: it was not saved by a LoRA run")
        plain = read_safetensors(folder / MODEL_FILE)
        tensors = {k: v for k, v in plain.items() if not self.own(k)}
        tensors.update(read_safetensors(folder / LORA_STATE))
        load_tensors(self.model, tensors, str(folder))

    def save_adapter(self, folder: Path) -> None:
        """adapter_config.json + adapter_model.safetensors, as PeftModel.save_pretrained
        writes them (``PeftModel.from_pretrained(base_model, folder)`` reads them back)."""
        peft = _peft()
        state = peft.get_peft_model_state_dict(self.model, adapter_name=ADAPTER,
                                               save_embedding_layers=False)
        tensors = {PEFT_PREFIX + k: v.detach().to("cpu").contiguous() for k, v in state.items()}
        config = self.peft_config.to_dict()
        config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
        config["inference_mode"] = True
        config["auto_mapping"] = {"base_model_class": type(self.model).__name__,
                                  "parent_library": type(self.model).__module__}
        folder = Path(folder)
        atomic_write(folder / ADAPTER_WEIGHTS,
                     lambda tmp: save_file(tensors, tmp, {"format": "pt"}))
        atomic_write_json(folder / ADAPTER_CONFIG, config)

    def save_best(self, folder: Path) -> None:
        """Beside the merged best model: the adapter alone, when asked for."""
        if self.cfg.lora_save_adapter:
            self.save_adapter(folder)


def attach(model: nn.Module, meta: dict, given: dict, saved_meta: dict | None = None,
           resume: bool = False) -> Lora | None:
    """Inject the adapters a run asks for into ``model`` and record them in ``meta`` (its
    config.json); None when the run does not use LoRA."""
    cfg = settings(given, (saved_meta or {}).get("lora"), resume)
    if cfg is None:
        return None
    lora = Lora(model, cfg)
    meta["lora"] = dataclasses.asdict(cfg)
    return lora
