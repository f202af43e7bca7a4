"""thinkstruct: structured output for reasoning LLMs.

The model thinks freely inside ``<think>…</think>``; its answer is held, token by token,
to a JSON Schema, a regex, an EBNF grammar or a structural tag.
"""

from thinkstruct.errors import CompileTimeout, InvalidConstraint, ThinkstructError, UnsupportedConstraint
from thinkstruct.grammar.api import accepts, compile
from thinkstruct.grammar.base import CompiledGrammar, Grammar, GrammarBackend, InvalidGrammar
from thinkstruct.grammar.constraint import Constraint, ConstraintKind
from thinkstruct.grammar.json_format import JsonFormat
from thinkstruct.tokenizer import Tokenizer

__version__ = "0.1.0"

__all__ = [
    "CompileTimeout",
    "CompiledGrammar",
    "Constraint",
    "ConstraintKind",
    "Grammar",
    "GrammarBackend",
    "InvalidConstraint",
    "InvalidGrammar",
    "JsonFormat",
    "ThinkstructError",
    "Tokenizer",
    "UnsupportedConstraint",
    "__version__",
    "accepts",
    "compile",
]
