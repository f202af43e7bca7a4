"""``python -m thinkstruct.cli``: the ``thinkstruct`` command."""

from thinkstruct.cli import run

run()
