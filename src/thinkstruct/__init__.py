"""thinkstruct: structured output for reasoning LLMs.

The model thinks freely inside ``<think>…</think>``; its answer is held, token by token,
to a JSON Schema, a regex, an EBNF grammar or a structural tag.
"""

from thinkstruct.errors import CompileTimeout, InvalidConstraint, ThinkstructError, UnsupportedConstraint
from thinkstruct.grammar.constraint import Constraint, ConstraintKind
from thinkstruct.tokenizer import Tokenizer

__version__ = "0.1.0"

__all__ = [
    "CompileTimeout",
    "Constraint",
    "ConstraintKind",
    "InvalidConstraint",
    "ThinkstructError",
    "Tokenizer",
    "UnsupportedConstraint",
    "__version__",
]
