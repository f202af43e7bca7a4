"""The OpenAI wire format: request and response models (pydantic v2).

Requests are validated strictly: types are not coerced (``"max_tokens": "5"`` is a 400,
as it is for OpenAI) and non-finite numbers are refused.

Unknown fields. A field that is neither OpenAI's nor one of thinkstruct's extensions is a
400 naming it ("Unrecognized request argument supplied: reponse_format"), as OpenAI's own
API answers; a misspelt ``response_format`` must never quietly produce an unconstrained
answer. OpenAI fields with no effect on the answer (``user``, ``metadata``, ``store``,
``service_tier``, ``prompt_cache_key``, ``safety_identifier``, ``parallel_tool_calls``)
are accepted and ignored. OpenAI fields that would change the answer but are not
implemented (``functions``, audio, ...) are accepted
only with their no-op value (``false``, ``0``, ``null``, ``[]``, ``{}``) and are a 400
naming the field otherwise. Message objects are lenient: extra keys on a message (a
client echoing back a response's ``refusal`` or ``annotations``) are ignored.

Extensions (the openai client sends them with ``extra_body``): ``regex``, ``ebnf``,
``choice``, ``structural_tag``, ``backend``, ``chat_template_kwargs``,
``separate_reasoning``, ``max_reasoning_tokens``, ``top_k``, ``continue_final_message``,
``add_generation_prompt``, ``return_allowed_tokens`` (chat), ``repetition_penalty``, ``min_p``; ``response_format`` also takes ``{"type": "structural_tag",
...}`` as SGLang does.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from thinkstruct.server.effort import Effort
from thinkstruct.server.tool_protocol import ToolCallOut, ToolCallPiece

BackendName = Literal["auto", "xgrammar", "llguidance", "outlines"]


class StrictRequest(BaseModel):
    """A request model of any API: no coercion, unknown fields refused, finite numbers."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, populate_by_name=True)


# ---- constraints ---------------------------------------------------------------------


class JsonSchemaSpec(StrictRequest):
    """``response_format.json_schema``: OpenAI's structured-output schema."""

    name: str | None = Field(None, max_length=256)
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class TextFormat(StrictRequest):
    type: Literal["text"]


class JsonObjectFormat(StrictRequest):
    """``{"type": "json_object"}``: any JSON object; with ``schema`` (the convention of
    several hosted APIs, instructor's ``JSON_SCHEMA`` mode) the answer is held to that
    schema exactly as ``json_schema`` holds it."""

    type: Literal["json_object"]
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")


class JsonSchemaFormat(StrictRequest):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


class StructuralTagFormat(BaseModel):
    """SGLang's ``{"type": "structural_tag", "structures": [...], "triggers": [...]}``
    or ``{"type": "structural_tag", "format": {...}}``: everything but ``type`` is the tag."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["structural_tag"]

    def tag(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaFormat | StructuralTagFormat


class ConstraintFields(StrictRequest):
    """The constraint fields shared by chat and text completions."""

    response_format: ResponseFormat | None = Field(None, discriminator="type")
    regex: str | None = None
    ebnf: str | None = None
    choice: list[str] | None = None
    structural_tag: dict[str, Any] | str | None = None
    backend: BackendName | None = None


# ---- sampling ------------------------------------------------------------------------

SEED_MIN = -(2**63)
SEED_MAX = 2**64 - 1


class StreamOptions(StrictRequest):
    include_usage: bool = False


# Known OpenAI fields that are accepted only with a value that changes nothing.
_NO_OP_FIELDS = {
    "functions": "is not supported: use tools",
    "function_call": "is not supported: use tool_choice",
    "audio": "is not supported",
    "prediction": "is not supported",
    "web_search_options": "is not supported",
    "verbosity": "is not supported",
    "best_of": "is not supported (only equal to n)",
}


def is_no_op(value: Any) -> bool:
    return value is None or value is False or value == 0 or value == [] or value == {}


class SamplingFields(ConstraintFields):
    """Fields shared by chat and text completions: the model, sampling and streaming."""

    model: str = Field(min_length=1, max_length=1024)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    # accepted and ignored: no effect on the answer
    user: Any = None
    metadata: Any = None
    store: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None
    parallel_tool_calls: Any = None

    # penalties and bias (vLLM's semantics; repetition_penalty and min_p are extensions)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    logit_bias: dict[str, float] | None = None

    # accepted only with their no-op value (see _NO_OP_FIELDS)
    best_of: Any = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        values = [value] if isinstance(value, str) else value or []
        for text in values:
            if not text:
                raise ValueError("stop sequences must not be empty")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            if not (key.isascii() and key.isdigit()):
                raise FieldError(f"logit_bias.{key}", f"logit_bias keys are token ids, got {key!r}")
            if not -100 <= bias <= 100:
                raise FieldError(f"logit_bias.{key}", f"logit_bias.{key} must be in [-100, 100], got {bias}")
        return value

    @property
    def requested_logprobs(self) -> int | None:
        """How many alternatives to return per token; ``None``: no log-probabilities."""
        return None

    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        return tuple((int(key), float(bias)) for key, bias in (self.logit_bias or {}).items())

    @model_validator(mode="after")
    def _no_ops(self) -> SamplingFields:
        for name, reason in _NO_OP_FIELDS.items():
            if name in type(self).model_fields:
                value = getattr(self, name)
                if name == "best_of" and value == self.n:
                    continue
                if not is_no_op(value):
                    raise FieldError(name, f"{name} {reason}")
        return self

    def stop_sequences(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class FieldError(ValueError):
    """A model-level check that blames one field (the body reader reports ``param``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


# ---- chat ----------------------------------------------------------------------------


class ChatMessage(BaseModel):
    """One message; extra keys (``refusal``, ``annotations`` echoed from a response) are ignored."""

    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, str]] | None = None
    name: str | None = None
    reasoning_content: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # checked by the chat template, as HF does

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, value: Any) -> Any:
        # One clear message instead of pydantic's one per union member.
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ValueError(
                "content must be a string, a list of text parts or null"
            )  # not TypeError: pydantic reports only ValueError
        parts = []
        for i, part in enumerate(value):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise ValueError(f"content[{i}] must be an object with a type")
            if part["type"] != "text":
                raise ValueError(f"content[{i}] is of type {part['type']!r}; only text parts are supported")
            if not isinstance(part.get("text"), str):
                raise ValueError(f"content[{i}].text must be a string")
            parts.append({"type": "text", "text": part["text"]})
        return parts

    def template_view(self) -> dict[str, Any]:
        """The message as chat templates read it (``developer`` reads as ``system``)."""
        view: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": self.content,
        }
        for key in ("name", "reasoning_content", "tool_call_id", "tool_calls"):
            value = getattr(self, key)
            if value is not None:
                view[key] = value
        return view


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(None, ge=1)
    chat_template_kwargs: dict[str, Any] | None = None
    separate_reasoning: bool = True
    max_reasoning_tokens: int | None = Field(None, ge=0)
    continue_final_message: bool = False
    add_generation_prompt: bool | None = None
    return_allowed_tokens: bool = False  # thinkstruct.allowed_tokens: per token, how many the grammar allowed
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)

    # tool calling, read and checked by thinkstruct.server.tools
    tools: Any = None
    tool_choice: Any = None

    # OpenAI fields accepted only with their no-op value
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    prediction: Any = None
    web_search_options: Any = None
    modalities: list[Literal["text"]] | None = None
    verbosity: Any = None

    reasoning_effort: Effort | None = None  # thinking off, or its budget: thinkstruct.server.effort

    @field_validator("messages", mode="before")
    @classmethod
    def _messages(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("messages must not be empty")
        return value

    @model_validator(mode="after")
    def _chat_checks(self) -> ChatCompletionRequest:
        if (
            self.max_tokens is not None
            and self.max_completion_tokens is not None
            and self.max_tokens != self.max_completion_tokens
        ):
            raise FieldError(
                "max_completion_tokens", "max_tokens and max_completion_tokens disagree; give one"
            )
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise FieldError(
                "continue_final_message",
                "continue_final_message needs the last message to be the assistant's",
            )
        if self.top_logprobs is not None and not self.logprobs:
            raise FieldError("top_logprobs", "top_logprobs needs logprobs: true")
        if self.continue_final_message and self.add_generation_prompt:
            raise FieldError(
                "add_generation_prompt",
                "add_generation_prompt cannot be combined with continue_final_message",
            )
        return self

    @property
    def requested_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# ---- text completions ----------------------------------------------------------------


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: ``prompt`` is a string, a list of strings, a list of
    token ids or a list of lists of token ids (one choice set per prompt)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    suffix: str | None = None
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)
    top_logprobs: Any = None  # not a completions field; accepted only as null or 0

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("prompt must not be an empty list")
        if isinstance(value, list) and value and isinstance(value[0], list) and any(not ids for ids in value):
            raise ValueError("a token-id prompt must not be empty")
        return value

    @model_validator(mode="after")
    def _completion_checks(self) -> CompletionRequest:
        if not is_no_op(self.top_logprobs):
            raise FieldError("top_logprobs", "top_logprobs is a chat field: give logprobs (0..5) here")
        return self

    @property
    def requested_logprobs(self) -> int | None:
        return self.logprobs

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: text, or token ids."""
        value = self.prompt
        if isinstance(value, str):
            return [value]
        if value and isinstance(value[0], int):
            return [list(value)]  # type: ignore[arg-type,unused-ignore]
        return list(value)  # type: ignore[arg-type]


# ---- responses -----------------------------------------------------------------------


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)
    completion_tokens_details: CompletionTokensDetails = Field(default_factory=CompletionTokensDetails)


class GenerationInfo(BaseModel):
    """thinkstruct's own facts about an answer, in the extension field ``thinkstruct``.

    Attributes:
        backend: the grammar backend that held the answer (``None``: unconstrained).
        ignored_keywords: JSON pointers of schema keywords that backend does not enforce
            (only outside strict mode).
        compile_seconds: how long the request waited for its compiled grammar.
        jump_forward_tokens: tokens the grammar forced, appended without sampling.
        check_rollbacks: values that broke a checked keyword (one no grammar enforces)
            and were generated again; ``resampled_tokens``: the tokens taken back for
            them (never sent).
        time_to_first_token_s: seconds from submission to the first token (first choice).
        allowed_tokens: with ``return_allowed_tokens``, per choice, per output token: how
            many tokens the grammar allowed at its step (1 where jump-forward forced it, the
            vocabulary size where nothing constrained it); ``None`` when not asked for.
        max_reasoning_tokens: the thinking budget each choice had (the request's own, or
            the server's share of ``max_tokens``); ``None`` when it did not think.
    """

    backend: str | None = None
    ignored_keywords: list[str] = Field(default_factory=list)
    compile_seconds: float | None = None
    jump_forward_tokens: int = 0
    check_rollbacks: int = 0
    resampled_tokens: int = 0
    time_to_first_token_s: float | None = None
    allowed_tokens: list[list[int]] | None = None
    max_reasoning_tokens: int | None = None


#: Which part of the output ``max_tokens`` cut when a chat choice ends ``length``.
LengthPart = Literal["reasoning", "answer"]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    """Chat's ``logprobs``: per answer token in ``content``; the thought's tokens, when it is
    separated, in the extension ``reasoning_content``."""

    content: list[ChatTokenLogprob] | None = None
    refusal: list[ChatTokenLogprob] | None = None
    reasoning_content: list[ChatTokenLogprob] | None = None


class CompletionLogprobs(BaseModel):
    """The legacy completions ``logprobs`` object."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class ChoiceError(BaseModel):
    """Why a choice ended with ``finish_reason: "error"`` (a thinkstruct addition): the
    message; for an answer that could not meet a checked keyword, also the error object's
    ``type``, ``code``, ``keyword``, ``pointer``, ``schema_pointer`` and ``where`` (as the
    422 of a request not streamed has them)."""

    message: str
    type: str | None = None
    code: str | None = None
    keyword: str | None = None
    pointer: str | None = None
    schema_pointer: str | None = None
    where: str | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None
    error: ChoiceError | None = None
    length_part: LengthPart | None = None  # thinkstruct: what a "length" finish cut


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    thinkstruct: GenerationInfo | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallPiece] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None
    error: ChoiceError | None = None
    length_part: LengthPart | None = None  # thinkstruct: what a "length" finish cut


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    thinkstruct: GenerationInfo | None = None


class TextChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None
    error: ChoiceError | None = None


class TextCompletion(BaseModel):
    """A ``/v1/completions`` answer; streamed chunks have this shape too."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[TextChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    thinkstruct: GenerationInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "thinkstruct"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
