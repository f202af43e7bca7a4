"""The wire format of Anthropic's Messages API (``/v1/messages``): request and answer models.

Requests are strict (no coercion; unknown fields a 400 naming them). ``metadata``,
``service_tier``, ``cache_control``, ``container``, ``diagnostics``, ``inference_geo``,
``speed``, ``user_profile_id``, ``workspace_id`` and a block's ``cache_control`` /
``citations`` are accepted and have no effect. Content blocks are read by :mod:`.messages`
(each malformed block a 400 naming ``messages[i].content[j]...``). ``temperature``,
``top_p`` and ``top_k`` (which the client sends with ``extra_body``), ``seed`` and
``backend`` are read too.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from thinkstruct.server.protocol import SEED_MAX, SEED_MIN, BackendName, StrictRequest


class InputMessage(StrictRequest):
    role: Literal["user", "assistant"]
    content: str | list[Any]


class ThinkingEnabled(StrictRequest):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1)
    display: Literal["summarized", "omitted"] | None = None


class ThinkingAdaptive(StrictRequest):
    """Thinking on with the budget the effort (or the server's share) gives;
    ``between_tools`` reads the same here."""

    type: Literal["adaptive", "between_tools"]
    display: Literal["summarized", "omitted"] | None = None


class ThinkingDisabled(StrictRequest):
    type: Literal["disabled"]


class JsonOutputFormat(StrictRequest):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(StrictRequest):
    """``output_config``: the effort (``xhigh`` and ``max`` read as ``high``) and the
    answer's JSON schema (Anthropic's structured outputs)."""

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: JsonOutputFormat | None = None


class MessagesRequest(StrictRequest):
    """``POST /v1/messages``."""

    model: str = Field(min_length=1, max_length=1024)
    max_tokens: int = Field(ge=1)
    messages: list[InputMessage]
    system: str | list[Any] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    tools: list[Any] | None = None
    tool_choice: Any = None
    thinking: ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled | None = Field(None, discriminator="type")
    output_config: OutputConfig | None = None

    # accepted and ignored: no effect on the answer
    metadata: Any = None
    service_tier: Any = None
    cache_control: Any = None
    container: Any = None
    diagnostics: Any = None
    inference_geo: Any = None
    speed: Any = None
    user_profile_id: Any = None
    workspace_id: Any = None

    # extensions
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    backend: BackendName | None = None

    @field_validator("messages")
    @classmethod
    def _messages(cls, value: list[InputMessage]) -> list[InputMessage]:
        if not value:
            raise ValueError("messages must not be empty")
        return value

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not s for s in value):
            raise ValueError("stop sequences must not be empty")
        return value


# ---- answers ---------------------------------------------------------------------------


class ThinkingBlock(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""


class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = ThinkingBlock | TextBlock | ToolUseBlock

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class MessagesUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessageObject(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None = None
    usage: MessagesUsage


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    """Anthropic's error body: ``{"type": "error", "error": {"type", "message"}}``."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail
