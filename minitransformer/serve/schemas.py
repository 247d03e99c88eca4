"""The request bodies the server reads, as pydantic models (they are also /openapi.json).

Types are strict (``"1"`` is not a number, ``1`` is not a boolean), as OpenAI's API is; a value
outside its range is a 400 in OpenAI's error shape (``errors.install_handlers``). So is a field
a model does not name ("Unrecognized request argument supplied: foo", as OpenAI says it): an
option this server does not know is refused, never ignored.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..config import SEED_LIMIT

MAX_N = 16  # choices per prompt
MAX_PROMPTS = 16  # prompts per request
MAX_CHOICES = 64  # prompts x n: what one request may ask the server to write
MAX_STOPS = 4  # as OpenAI
MAX_LOGPROBS = 20  # top log-probabilities per token
MAX_TOP = 50  # top_k of the page's probability view


def unicode_text(value):
    """``value`` as it came, unless a string in it is not Unicode text: JSON can spell half of
    a UTF-16 pair alone ("\\ud800"), which is no character and which no tokenizer reads (a BPE
    run's failed as a 500)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"character {e.start} is {value[e.start]!r}, half of a UTF-16 "
                             f"surrogate pair alone: not a character") from None
    elif isinstance(value, list):
        for item in value:
            unicode_text(item)
    return value


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    @field_validator("*")
    @classmethod
    def _unicode(cls, value):  # every field's strings, nested in lists too
        return unicode_text(value)


class StreamOptions(Strict):
    """OpenAI's ``stream_options`` (with ``stream: true`` only)."""

    include_usage: bool = Field(False, description="one more chunk before [DONE]: no "
                                "choices, and the usage of the whole request (every other "
                                "chunk then carries usage null)")
    include_obfuscation: bool = Field(False, description="not supported (this server pads no "
                                      "events): must be absent or false")


class CompletionRequest(Strict):
    """POST /v1/completions (OpenAI's legacy completions API; ``top_k`` is an extension)."""

    model: str = Field(description="the model's id, from GET /v1/models")
    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        description="text to continue, a list of texts, token ids, or a list of token-id "
                    "lists")
    max_tokens: int | None = Field(16, ge=0, description="new tokens per choice (capped by the "
                                   "server's --max_tokens)")
    temperature: float | None = Field(1.0, ge=0.0, allow_inf_nan=False,
                                      description="0 = greedy; higher = more random")
    top_p: float | None = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling; 1 = off")
    top_k: int = Field(0, ge=0, description="the k most likely tokens only; 0 = off")
    n: int | None = Field(1, ge=1, le=MAX_N, description="choices per prompt; choice i is "
                          "seeded seed + i")
    stop: str | list[str] | None = Field(None, description="up to 4 strings that end a choice "
                                         "(not included in its text)")
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT, description="same seed, same text")
    stream: bool | None = Field(False, description="server-sent events in OpenAI's chunk "
                                "format")
    stream_options: StreamOptions | None = Field(None, description="with stream only")
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS,
                                 description="top log-probabilities per token (temperature 1)")
    echo: bool | None = Field(False, description="not supported: must be false")
    user: str | None = Field(None, description="the end user's id, for OpenAI's abuse "
                             "monitoring: accepted and not used (it changes no text)")
    # OpenAI's options that would change the text and that this server does not implement:
    # each is a 400 "unsupported" when asked for, never silently ignored (``plan_completion``)
    suffix: str | None = Field(None, description="not supported: must be absent")
    best_of: int | None = Field(None, description="not supported: must be absent or equal n")
    logit_bias: dict[str, float] | None = Field(None, description="not supported: must be "
                                                "absent or empty")
    presence_penalty: float | None = Field(0.0, description="not supported: must be 0")
    frequency_penalty: float | None = Field(0.0, description="not supported: must be 0")

    @model_validator(mode="after")
    def _null_is_the_default(self):
        """OpenAI's API takes null for these (a client may send every option it has): the
        default, as if absent."""
        for name in ("temperature", "top_p", "n", "stream", "echo", "presence_penalty",
                     "frequency_penalty"):
            if getattr(self, name) is None:
                setattr(self, name, type(self).model_fields[name].default)
        return self


class InspectRequest(Strict):
    """POST /api/inspect: what the model computes at one position of a text."""

    text: str = Field(min_length=1, description="the text (a position is read through its "
                      "window: at most block_size tokens)")
    position: int = Field(-1, description="token index; -1 = the last")
    top: int = Field(10, ge=1, le=MAX_TOP, description="next-token probabilities shown")
    prompt: int | None = Field(None, ge=1, description="tokens of the text that were the "
                               "prompt of a completion: later positions are seen through the "
                               "windows its generation used (the default context shift past "
                               "block_size, the start tokens kept); default, or more than the "
                               "text holds (its "
                               "tokens read alone can outnumber the whole text's): the "
                               "whole text")


class TranslateRequest(Strict):
    """POST /api/translate (encoder-decoder runs)."""

    text: str = Field(min_length=1, description="one source sentence")
    beam: int = Field(1, ge=1, le=16, description="beam size; 1 = greedy")


class FillMaskRequest(Strict):
    """POST /api/fill-mask (masked-LM encoder runs)."""

    text: str = Field(min_length=1, description="text with one or more [MASK] slots")
    top: int = Field(5, ge=1, le=MAX_TOP, description="predictions per slot")


class WalkthroughRequest(Strict):
    """POST /api/walkthrough (GPT runs): the eight-step walkthrough of a text."""

    text: str = Field(min_length=1, description="the text (at most 64 tokens, and at most "
                      "block_size)")
    layer: int = Field(0, ge=0, description="the layer the page opens on")
    head: int = Field(0, ge=0, description="the head the page opens on")
    top: int = Field(10, ge=1, le=MAX_TOP, description="next-token probabilities shown")
    lang: Literal["en", "zh"] | None = Field(None, description="the language the page opens "
                                             "in (default: the server's --lang)")
    tail: bool = Field(False, description="a longer text: walk through its last tokens that "
                       "fit (64, and block_size), not refuse it")
