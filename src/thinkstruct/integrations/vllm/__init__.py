"""thinkstruct as a vLLM plugin.

Installed with the package, loaded by vLLM in each of its processes through the
``vllm.general_plugins`` entry point (:func:`~thinkstruct.integrations.vllm.plugin.register`):

- every reasoning family of :mod:`thinkstruct.parsers` becomes a vLLM reasoning parser named
  ``thinkstruct-<family>`` (:mod:`.reasoning`);
- ``--structured-outputs-config.backend thinkstruct`` compiles vLLM's structured-output
  requests with thinkstruct's compiler (:mod:`.backend`): ``auto`` backend choice, strict
  refusal with JSON pointers as HTTP 400 (:mod:`.frontend`), compile deadlines in killable
  workers, bounded caches, reasoning-aware grammars, checked keywords enforced at their
  values' closing tokens (:mod:`.closing`);
- the one place that reaches into vLLM where it has no extension point is :mod:`.seam`.

Nothing here imports vLLM at import time except the modules that subclass its types; the
plugin imports them only inside vLLM's processes.
"""
