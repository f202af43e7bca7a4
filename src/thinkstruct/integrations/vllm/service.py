"""The plugin's compile service, one per process and model: :class:`PluginCompiler`.

vLLM validates a request in its API server process and compiles its grammar in the engine
core process, so each builds one of these (:func:`plugin_compiler`): thinkstruct's
tokenizer for the served model, a :class:`~thinkstruct.grammar.service.compiler.GrammarCompiler`
(``auto`` backend choice, deadline, killable workers, bounded cache) and the one decision
strict mode adds inside vLLM: a grammar whose checked keywords the closing-token rule
cannot enforce is refused, naming the keyword's pointer (:func:`enforceable`). No vLLM import.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
from typing import Any

from thinkstruct.errors import InvalidConstraint
from thinkstruct.grammar.base import CompiledGrammar
from thinkstruct.grammar.constraint import Constraint
from thinkstruct.grammar.schema.checks import CheckPlan
from thinkstruct.grammar.schema.dead_ends import dead_ends
from thinkstruct.grammar.service.compiler import GrammarCompiler
from thinkstruct.integrations.vllm.settings import PluginSettings
from thinkstruct.tokenizer import Tokenizer


def constraint_of(kind: str, spec: str) -> Constraint:
    """The :class:`Constraint` of one of vLLM's structured-output keys
    (``StructuredOutputOptions`` member name, spec text).

    Raises:
        InvalidConstraint: the spec is not a constraint of its kind (names the part).
    """
    if kind == "JSON":
        return Constraint.json_schema(spec)
    if kind == "JSON_OBJECT":
        return Constraint.json_object()
    if kind == "REGEX":
        return Constraint.regex(spec)
    if kind == "GRAMMAR":
        return Constraint.ebnf(spec)
    if kind == "CHOICE":
        return Constraint.choice(_choices(spec))
    if kind == "STRUCTURAL_TAG":
        return Constraint.structural_tag(spec)
    raise InvalidConstraint(f"vLLM's structured output {kind} has no thinkstruct constraint")


def _choices(spec: str) -> list[str]:
    try:
        options: Any = json.loads(spec)
    except ValueError:
        raise InvalidConstraint("choice must be a JSON list of strings", kind="choice") from None
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        raise InvalidConstraint("choice must be a list of strings", kind="choice")
    return options


def enforceable(compiled: CompiledGrammar) -> CompiledGrammar:
    """``compiled``, if a serving engine that cannot take tokens back can enforce it.

    Raises:
        InvalidConstraint: a checked keyword whose closing-token enforcement may leave no
            token (naming the keyword and its pointer), or checks inside a structural tag
            (tool-call arguments), which the closing-token rule does not follow.
    """
    checks = compiled.checks
    if checks is None:
        return compiled
    if not isinstance(checks, CheckPlan):
        first = next((e for e in checks.enforcement if e.enforcement == "checked"), None)
        raise InvalidConstraint(
            "inside vLLM, keywords no grammar enforces cannot be checked in tool-call arguments "
            f"({first.keyword if first else 'a keyword'}); turn strict mode off to ignore them",
            pointer=first.pointer if first else None,
            kind=compiled.constraint.kind.value,
        )
    found = dead_ends(checks)
    if found:
        first = found[0]
        others = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise InvalidConstraint(
            f"{first.keyword} is enforced inside vLLM only where a value can always be completed "
            f"to pass it, and this one's values may leave no token to close them{others}; "
            "turn strict mode off to ignore it",
            pointer=first.pointer,
            kind=compiled.constraint.kind.value,
        )
    return compiled


class PluginCompiler:
    """Compiles vLLM's structured-output requests for one served model.

    Args:
        tokenizer_path: the model's tokenizer directory (vLLM's ``model_config.tokenizer``).
        vocab_size: the model's vocabulary size (rows of its output layer).
        settings: the plugin's options.
    """

    def __init__(self, tokenizer_path: str, vocab_size: int, settings: PluginSettings) -> None:
        self.settings = settings
        self.tokenizer = Tokenizer.from_pretrained(tokenizer_path, vocab_size=vocab_size)
        self.compiler = GrammarCompiler(self.tokenizer, settings.compiler_config())

    def submit(self, constraint: Constraint) -> concurrent.futures.Future[CompiledGrammar]:
        """A future of the checked grammar (see :meth:`compile`), done by the deadline."""
        future = self.compiler.submit(constraint)
        checked: concurrent.futures.Future[CompiledGrammar] = concurrent.futures.Future()

        def done(f: concurrent.futures.Future[CompiledGrammar]) -> None:
            try:
                checked.set_result(enforceable(f.result()))
            except BaseException as error:  # noqa: BLE001  # handed to the waiter as is
                checked.set_exception(error)

        future.add_done_callback(done)
        return checked

    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """The compiled grammar, enforceable inside vLLM.

        Raises:
            InvalidConstraint: invalid, refused in strict mode (naming the pointer), or
                not enforceable without undo (:func:`enforceable`).
            CompileTimeout: not compiled by the deadline.
        """
        return enforceable(self.compiler.compile(constraint))

    def close(self) -> None:
        self.compiler.close()


@functools.cache
def plugin_compiler(tokenizer_path: str, vocab_size: int) -> PluginCompiler:
    """This process's :class:`PluginCompiler` for a model (settings from the environment)."""
    return PluginCompiler(tokenizer_path, vocab_size, PluginSettings.from_env())


__all__ = ["PluginCompiler", "constraint_of", "enforceable", "plugin_compiler"]
