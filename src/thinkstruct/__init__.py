"""thinkstruct: structured output for reasoning LLMs.

The model thinks freely inside ``<think>…</think>``; its answer is held, token by token,
to a JSON Schema, a regex, an EBNF grammar or a structural tag.
"""

import os as _os

# The engine's OpenMP threads sleep between passes instead of spinning: an idle thread
# spinning for its next region takes the core from the HTTP loop, Ray's threads and any
# other process (measured, 8 clients beside a busy test run: 17 tok/s on two spinning
# threads, 628 on two passive ones). libgomp reads this once, when it loads with torch, so
# it is set before anything here imports torch; a value already set is kept.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from thinkstruct.errors import CompileTimeout, InvalidConstraint, ThinkstructError, UnsupportedConstraint
from thinkstruct.grammar.api import accepts, compile
from thinkstruct.grammar.base import CompiledGrammar, GrammarBackend, GrammarMatcher, InvalidGrammar
from thinkstruct.grammar.constraint import Constraint, ConstraintKind
from thinkstruct.grammar.json_format import JsonFormat
from thinkstruct.grammar.runtime.reasoning import ReasoningGrammar
from thinkstruct.grammar.service.compiler import CompilerConfig, CompilerStats, GrammarCompiler
from thinkstruct.parsers import (
    ChatPrompt,
    ChatTemplate,
    ChatTemplateError,
    CompletionTemplate,
    FimPosition,
    InvalidChatRequest,
    ParseResult,
    ReasoningFamily,
    ReasoningParser,
    UnknownName,
    completion_templates,
    fim_prompt,
    get_reasoning_family,
    load_completion_templates,
    reasoning_enabled,
    reasoning_families,
    register_completion_template,
    register_reasoning_family,
    render_chat,
)
from thinkstruct.tokenizer import Tokenizer

__version__ = "0.1.0"

__all__ = [
    "ChatPrompt",
    "ChatTemplate",
    "ChatTemplateError",
    "CompileTimeout",
    "CompiledGrammar",
    "CompilerConfig",
    "CompilerStats",
    "CompletionTemplate",
    "Constraint",
    "ConstraintKind",
    "FimPosition",
    "GrammarBackend",
    "GrammarCompiler",
    "GrammarMatcher",
    "InvalidChatRequest",
    "InvalidConstraint",
    "InvalidGrammar",
    "JsonFormat",
    "ParseResult",
    "ReasoningFamily",
    "ReasoningGrammar",
    "ReasoningParser",
    "ThinkstructError",
    "Tokenizer",
    "UnknownName",
    "UnsupportedConstraint",
    "__version__",
    "accepts",
    "compile",
    "completion_templates",
    "fim_prompt",
    "get_reasoning_family",
    "load_completion_templates",
    "reasoning_enabled",
    "reasoning_families",
    "register_completion_template",
    "register_reasoning_family",
    "render_chat",
]
