"""The wire format of OpenAI's Responses API (``/v1/responses``): request and answer models.

Requests are strict as chat's are (no coercion, unknown fields a 400 naming them). Fields
with no effect on the answer (``user``, ``metadata``, ``include``, ``service_tier``,
``truncation``, ``prompt_cache_key``...) are accepted; ``metadata`` is echoed. Fields that
would change the answer but are not implemented (``background``, ``conversation``,
``prompt``, ``max_tool_calls``, ``top_logprobs``) are accepted only with their no-op value.
``input`` items are read by :mod:`.responses` (each malformed item a 400 naming
``input[i]...``). Extensions: ``seed``, ``top_k``, ``backend``, ``max_reasoning_tokens``,
``chat_template_kwargs``.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from thinkstruct.server.effort import Effort
from thinkstruct.server.protocol import (
    SEED_MAX,
    SEED_MIN,
    BackendName,
    FieldError,
    GenerationInfo,
    StrictRequest,
    is_no_op,
)


class FormatText(StrictRequest):
    type: Literal["text"]


class FormatJsonObject(StrictRequest):
    """Any JSON object; with ``schema`` (an extension, as on chat) held to that schema."""

    type: Literal["json_object"]
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")


class FormatJsonSchema(StrictRequest):
    type: Literal["json_schema"]
    name: str | None = Field(None, max_length=256)
    description: str | None = None
    schema_: dict[str, Any] | bool = Field(alias="schema")
    strict: bool | None = None


class TextConfig(StrictRequest):
    format: FormatText | FormatJsonObject | FormatJsonSchema | None = Field(None, discriminator="type")
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted, no effect


class ReasoningConfig(StrictRequest):
    effort: Effort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


_NO_OPS = ("background", "conversation", "prompt", "max_tool_calls", "top_logprobs")


class ResponsesRequest(StrictRequest):
    """``POST /v1/responses``."""

    model: str = Field(min_length=1, max_length=1024)
    input: str | list[Any]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    text: TextConfig | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = Field(None, min_length=1, max_length=256)
    metadata: dict[str, str] | None = None

    # accepted and ignored: no effect on the answer
    include: list[str] | None = None
    user: Any = None
    service_tier: Any = None
    truncation: Literal["auto", "disabled"] | None = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    safety_identifier: Any = None
    stream_options: Any = None

    # accepted only with their no-op value
    background: Any = None
    conversation: Any = None
    prompt: Any = None
    max_tool_calls: Any = None
    top_logprobs: Any = None

    # extensions
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    top_k: int | None = Field(None, ge=-1)
    backend: BackendName | None = None
    max_reasoning_tokens: int | None = Field(None, ge=0)
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _no_ops(self) -> ResponsesRequest:
        for name in _NO_OPS:
            if not is_no_op(getattr(self, name)):
                raise FieldError(name, f"{name} is not supported")
        if isinstance(self.input, list) and not self.input:
            raise FieldError("input", "input must not be empty")
        return self

    @property
    def effort(self) -> Effort | None:
        return None if self.reasoning is None else self.reasoning.effort

    @property
    def summary(self) -> bool:
        """A reasoning summary was asked for (the thought itself is the summary)."""
        return (
            self.reasoning is not None
            and (self.reasoning.summary or self.reasoning.generate_summary) is not None
        )


# ---- answers ---------------------------------------------------------------------------


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class SummaryText(BaseModel):
    type: Literal["summary_text"] = "summary_text"
    text: str


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class ReasoningItem(BaseModel):
    """The thought: its text in ``content``, and in ``summary`` when one was asked for."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ReasoningText] = Field(default_factory=list)
    status: ItemStatus = "completed"


class MessageItem(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: ItemStatus = "completed"
    content: list[OutputText] = Field(default_factory=list)


class FunctionCallItem(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus = "completed"


OutputItem = ReasoningItem | MessageItem | FunctionCallItem


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseError(BaseModel):
    code: str
    message: str


ResponseStatus = Literal["completed", "failed", "in_progress", "incomplete", "cancelled"]


class ResponseObject(BaseModel):
    """A response: ``output`` holds the ``reasoning``, ``message`` and ``function_call``
    items in the order the model wrote them."""

    id: str
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    status: ResponseStatus
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    usage: ResponseUsage | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] = Field(default_factory=dict)
    store: bool = True
    temperature: float | None = None
    top_p: float | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: Any = "auto"
    tools: list[Any] = Field(default_factory=list)
    truncation: str = "disabled"
    user: Any = None
    thinkstruct: GenerationInfo | None = None


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: Literal[True] = True
