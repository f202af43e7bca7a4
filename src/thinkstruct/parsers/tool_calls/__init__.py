"""Tool-call detectors: content and calls out of an answer, whole or streamed.

- :class:`ToolCallParser` (``parse`` / ``feed`` + ``finish``) for a syntax or a family.
- :class:`ToolCallSyntax` entries in a registry (:func:`tool_call_syntaxes`), one per way
  of writing calls: ``hermes`` (Hermes/Qwen JSON, SmolLM2 lists, Qwen3-Coder XML inside
  ``<tool_call>``; ``hermes-list`` and ``qwen3-coder`` read the same and constrain
  SmolLM2's list and Qwen3-Coder's XML), ``llama3-json``, ``mistral``, ``deepseek-v3``
  (V3/R1 and V3.1; ``deepseek-v3.1`` constrains the V3.1 form),
  ``dsml`` (DeepSeek-V3.2 and V4), ``kimi-k2``, ``glm45`` (GLM-4.5 to 4.7; ``glm47``
  constrains 4.7's form), ``harmony``
  (gpt-oss), ``pythonic``, ``minimax-m2``, ``gemma4``, ``hunyuan``, ``granite``,
  ``cohere``.
"""

from thinkstruct.parsers.tool_calls import forms
from thinkstruct.parsers.tool_calls.forms import CallForm, tool_call_structural_tag
from thinkstruct.parsers.tool_calls.json_calls import (
    DeepSeekV3Syntax,
    HermesSyntax,
    JsonSectionSyntax,
    KimiK2Syntax,
    Llama3JsonSyntax,
    MistralSyntax,
)
from thinkstruct.parsers.tool_calls.other_calls import (
    Gemma4Syntax,
    HarmonySyntax,
    PythonicSyntax,
)
from thinkstruct.parsers.tool_calls.parser import ToolCallParser, join_results
from thinkstruct.parsers.tool_calls.syntax import (
    ScannedCall,
    SectionScan,
    ToolCallSyntax,
    get_tool_call_syntax,
    register_tool_call_syntax,
    tool_call_syntaxes,
    unregister_tool_call_syntax,
)
from thinkstruct.parsers.tool_calls.types import (
    ToolCall,
    ToolCallDelta,
    ToolParseResult,
    ToolSchemas,
    ToolStreamResult,
)
from thinkstruct.parsers.tool_calls.xml_calls import (
    DSML_XML,
    MINIMAX_XML,
    Glm45Syntax,
    XmlSectionSyntax,
)


def _deepseek_v31() -> DeepSeekV3Syntax:
    syntax = DeepSeekV3Syntax()
    syntax.name = "deepseek-v3.1"
    syntax.form = forms.DEEPSEEK_V31
    syntax.description = "DeepSeek-V3.1+: reads as deepseek-v3, constrained calls written name<sep>{json}"
    return syntax


# Entries that read alike but write a constrained call differently are separate entries,
# so that a family names exactly what its model writes.
for _syntax in (
    HermesSyntax(),
    HermesSyntax(
        "hermes-list",
        form=forms.HERMES_LIST,
        description="as hermes; constrained calls written as one <tool_call>[{...}, ...]</tool_call> list (SmolLM2)",
    ),
    HermesSyntax(
        "qwen3-coder",
        form=forms.QWEN3_CODER,
        description="as hermes; constrained calls written <function=f><parameter=p>v</parameter></function> (Qwen3.5)",
    ),
    Llama3JsonSyntax(),
    MistralSyntax(),
    DeepSeekV3Syntax(),
    _deepseek_v31(),
    XmlSectionSyntax(
        "dsml",
        ("<｜DSML｜tool_calls>", "<｜DSML｜function_calls>"),
        ("</｜DSML｜tool_calls>", "</｜DSML｜function_calls>"),
        DSML_XML,
        description='DeepSeek DSML: <｜DSML｜tool_calls> (V4) or function_calls (V3.2), invoke/parameter string="true|false"',
        form=forms.DSML,
    ),
    KimiK2Syntax(),
    Glm45Syntax(),
    Glm45Syntax("glm47", form=forms.GLM47),
    HarmonySyntax(),
    PythonicSyntax(),
    XmlSectionSyntax(
        "minimax-m2",
        ("<minimax:tool_call>",),
        ("</minimax:tool_call>",),
        MINIMAX_XML,
        description='MiniMax-M2: <minimax:tool_call><invoke name="f"><parameter name="p">v</parameter></invoke>',
        form=forms.MINIMAX_M2,
    ),
    Gemma4Syntax(),
    JsonSectionSyntax(
        "hunyuan",
        "<tool_calls>",
        "</tool_calls>",
        description="Hunyuan: <tool_calls>[{json}]</tool_calls>",
        form=forms.HUNYUAN,
    ),
    JsonSectionSyntax(
        "granite", "<|tool_call|>", None, description="Granite 3.x: <|tool_call|>[{json}]", form=forms.GRANITE
    ),
    JsonSectionSyntax(
        "cohere",
        "<|START_ACTION|>",
        "<|END_ACTION|>",
        name_keys=("tool_name", "name"),
        argument_keys=("parameters", "arguments"),
        description='Cohere Command: <|START_ACTION|>[{"tool_name": ..., "parameters": {...}}]<|END_ACTION|>',
        form=forms.COHERE,
    ),
):
    register_tool_call_syntax(_syntax)
del _syntax

__all__ = [
    "CallForm",
    "ScannedCall",
    "SectionScan",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolCallSyntax",
    "ToolParseResult",
    "ToolSchemas",
    "ToolStreamResult",
    "get_tool_call_syntax",
    "join_results",
    "register_tool_call_syntax",
    "tool_call_structural_tag",
    "tool_call_syntaxes",
    "unregister_tool_call_syntax",
]
