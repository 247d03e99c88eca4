"""How a sentence-transformers folder turns token vectors into one sentence vector.

A folder written by ``SentenceTransformer.save`` lists its modules in ``modules.json``: the
Transformer, then a ``Pooling`` module (its ``config.json`` sets the mode), and often a
``Normalize`` module (unit length). all-MiniLM-L6-v2 pools by the mean and normalises;
BGE-style models take the [CLS] vector. A plain BERT folder has no modules.json: its sentence
vector here is the normalised mean, as for all-MiniLM-L6-v2.

    mode   e = ...                                   h (T, C): the encoder's output
    mean   sum_t m_t h_t / sum_t m_t                  m: 1 for real tokens, 0 for padding
    cls    h_0                                        the first token, [CLS]
    max    max_t over real tokens of h_t, per channel

Modules this reads nothing of (a Dense projection, other pooling modes) are refused by name:
an embedding that silently differs from the model's own would be worse than none.

Before the encoder, ``SentenceTransformer.encode`` puts the folder's default prompt before
each sentence (``default_prompt_name`` in config_sentence_transformers.json, e5's
``"query: "``), then lowercases the text where sentence_bert_config.json sets
``do_lower_case``; ``sentence_texts`` does the same.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError

# the Pooling config of sentence-transformers before 6: one true/false key a mode
MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
         "pooling_mode_max_tokens": "max"}
UNSUPPORTED_MODES = ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                     "pooling_mode_lasttoken")
# from 6 on: "pooling_mode", a name or a list of names (several concatenated)
NAMED_MODES = ("mean", "cls", "max")
KNOWN_MODULES = ("Transformer", "Pooling", "Normalize")


@dataclass(frozen=True)
class Pooling:
    mode: str = "mean"  # mean, cls or max
    normalize: bool = True  # divide by the L2 norm
    include_prompt: bool = True  # False: a prompt's tokens are left out of the pooling


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: cannot read {what} ({e})") from None


def read_pooling(folder) -> Pooling:
    """The folder's pooling, from its modules.json and its Pooling module's config.json; the
    normalised mean where it has no modules.json."""
    folder = Path(folder)
    if not (folder / "modules.json").is_file():
        return Pooling()
    modules = _read_json(folder / "modules.json", "the sentence-transformers modules")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise UserError(f"{folder / 'modules.json'}: expected a list of modules")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    other = [k for k in kinds if k not in KNOWN_MODULES]
    if other:
        raise UserError(f"{folder} has a {other[0]} module, which embed does not implement "
                        f"(it reads Transformer, Pooling and Normalize)")
    pooling = next((m for m, k in zip(modules, kinds, strict=True) if k == "Pooling"), None)
    mode = "mean"
    if pooling is not None:
        if not pooling.get("path"):
            raise UserError(f"{folder / 'modules.json'}: its Pooling module names no path")
        config = _read_json(folder / str(pooling["path"]) / "config.json",
                            "the Pooling module's config")
        if not isinstance(config, dict):
            raise UserError(f"{folder}: the Pooling module's config.json is not an object")
        chosen, unsupported = _modes(folder, config)
        if unsupported:
            raise UserError(f"{folder} pools by {unsupported[0]}, which embed does not implement "
                            f"(it pools by mean, cls or max)")
        if len(chosen) != 1:
            raise UserError(f"{folder}'s Pooling module sets {len(chosen)} modes; embed "
                            f"pools by exactly one (mean, cls or max)")
        mode = chosen[0]
        return Pooling(mode, "Normalize" in kinds, config.get("include_prompt") is not False)
    return Pooling(mode, "Normalize" in kinds)


def _modes(folder: Path, config: dict) -> tuple[list[str], list[str]]:
    """(the modes embed implements, the others) a Pooling config names, in either format."""
    if "pooling_mode" not in config:  # before sentence-transformers 6
        return ([MODES[k] for k in MODES if config.get(k)],
                [k.removeprefix("pooling_mode_") for k in UNSUPPORTED_MODES if config.get(k)])
    named = config["pooling_mode"]
    names = [named] if isinstance(named, str) else named
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise UserError(f"{folder}: the Pooling module's pooling_mode is not a name or a list "
                        f"of names")
    return [n for n in names if n in NAMED_MODES], [n for n in names if n not in NAMED_MODES]


def sentence_texts(folder, sentences: list[str]) -> list[str]:
    """The texts the encoder reads for ``sentences``: the default prompt first, lowercased
    where the folder says so (as ``SentenceTransformer.encode``)."""
    folder, prompt, lower = Path(folder), default_prompt(folder), False
    if (folder / "sentence_bert_config.json").is_file():
        config = _read_json(folder / "sentence_bert_config.json", "the Transformer's settings")
        lower = isinstance(config, dict) and config.get("do_lower_case") is True
    texts = [prompt + s for s in sentences]
    return [t.lower() for t in texts] if lower else texts


def default_prompt(folder) -> str:
    """The prompt ``SentenceTransformer.encode`` puts before each sentence ("" for none)."""
    folder, prompt = Path(folder), ""
    if (folder / "config_sentence_transformers.json").is_file():
        config = _read_json(folder / "config_sentence_transformers.json",
                            "the sentence-transformers settings")
        name = config.get("default_prompt_name") if isinstance(config, dict) else None
        prompts = config.get("prompts") if name else None
        if name and not (isinstance(prompts, dict) and isinstance(prompts.get(name), str)):
            raise UserError(f"{folder / 'config_sentence_transformers.json'}: its "
                            f"default_prompt_name {name!r} names no prompt in its prompts")
        prompt = prompts[name] if name else ""
    return prompt


__all__ = ["Pooling", "default_prompt", "read_pooling", "sentence_texts"]
