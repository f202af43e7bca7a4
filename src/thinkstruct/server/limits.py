"""The operator's limits on one request (:class:`ServerSettings`), each a 400 naming the field.

The body size limit is enforced while the body is read (:mod:`.body`); the queue limit
by the engine (a 429). These are the rest: choices, stop sequences, prompt length.
"""

from __future__ import annotations

from collections.abc import Sequence

from thinkstruct.server.errors import bad_request
from thinkstruct.server.settings import ServerSettings


def check_request_limits(n: int, stops: Sequence[str], settings: ServerSettings, *, prompts: int = 1) -> None:
    """``n`` (times the number of prompts) and ``stop`` within the server's limits."""
    if n * prompts > settings.max_n:
        what = f"n = {n}" if prompts == 1 else f"n = {n} for each of {prompts} prompts"
        raise bad_request(
            f"{what} asks for more than the {settings.max_n} choices this server allows per request",
            param="n",
        )
    if len(stops) > settings.max_stop_sequences:
        raise bad_request(
            f"stop has {len(stops)} sequences; at most {settings.max_stop_sequences} are allowed",
            param="stop",
        )


def check_prompt_length(tokens: int, settings: ServerSettings, *, param: str) -> None:
    """The prompt within ``max_prompt_tokens`` (the context is checked with ``max_tokens``)."""
    limit = settings.max_prompt_tokens
    if limit is not None and tokens > limit:
        raise bad_request(
            f"the prompt is {tokens} tokens, longer than this server's limit of {limit}",
            param=param,
            code="prompt_too_long",
        )
