"""The playground page in a real headless Chromium against a real server on SmolLM2.

``THINKSTRUCT_SCREENSHOT=docs/playground.png`` saves the finished request of
:func:`test_example_schema_answer_is_valid_and_plotted` there (how the README's picture
is made).
"""

from __future__ import annotations

import json
import os
from typing import Any

import jsonschema
from playground_harness import PREFIX
from server_harness import API_KEY, RunningServer


def _open(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("#model[data-ready=true]")


def _pick(page: Any, kind: str, example: str) -> None:
    page.select_option("#kind", kind)
    page.select_option("#example", label=example)


def test_example_schema_answer_is_valid_and_plotted(server: RunningServer, page: Any, console: Any) -> None:
    _open(page, server.url + "/")
    _pick(page, "json_schema", "Person")
    page.wait_for_selector("#lint[data-state=ok]")
    assert "compiles" in page.inner_text("#lint")
    page.fill("#seed", "7")
    page.fill("#budget", "24")
    page.click("#send")
    page.wait_for_selector("#verdict:not([data-state=none])")

    assert page.get_attribute("#verdict", "data-state") == "valid", page.inner_text("#errors")
    assert page.inner_text("#verdict").startswith("✓")
    schema = json.loads(page.input_value("#constraint"))
    shown = json.loads(page.inner_text("#answer"))  # the pretty-printed answer
    jsonschema.validate(shown, schema)
    assert page.inner_text("#s-finish") == "stop"
    assert page.inner_text("#s-backend") in ("llguidance", "xgrammar", "outlines")
    assert float(page.inner_text("#s-rate")) > 0
    assert page.inner_text("#s-ttft").endswith(("ms", "s"))
    assert int(page.inner_text("#s-forced")) >= 0

    # One point per output token, the thought's shaded: the engine's own counts.
    tokens = int(page.inner_text("#s-tokens"))
    reasoning = int(page.inner_text("#s-reasoning"))
    assert 0 < reasoning < tokens
    assert page.locator("#plot circle.pt").count() == tokens
    assert page.locator("#plot circle.pt.thought").count() == reasoning
    assert page.locator("#plot rect.band").count() == 1
    assert page.inner_text("#thought").strip()

    screenshot = os.environ.get("THINKSTRUCT_SCREENSHOT")
    if screenshot:
        page.screenshot(path=screenshot, full_page=True)
    assert console.errors() == []


def test_broken_constraints_show_their_error_before_sending(
    server: RunningServer, page: Any, console: Any
) -> None:
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if "chat/completions" in r.url else None)
    _open(page, server.url + "/")

    _pick(page, "json_schema", "Broken: unknown type")
    page.wait_for_selector("#lint[data-state=error]")
    assert page.inner_text("#lint .pointer") == "/properties/age/type"
    assert "integr" in page.inner_text("#lint")

    # Typing in the editor lints again: a JSON syntax error is located by line and column.
    page.fill("#constraint", '{\n  "type": "object",\n  "properties": {,}\n}')
    page.wait_for_selector("#lint .linecol")
    assert page.inner_text("#lint .linecol") == "line 3, column 18"
    assert page.inner_text("#lint .excerpt").endswith("^")

    _pick(page, "regex", "Broken: unclosed group")
    page.wait_for_selector("#lint[data-state=error]")
    assert "unclosed" in page.inner_text("#lint")

    # Strict mode checks what lenient mode only lists as ignored, each with its pointer.
    _pick(page, "json_schema", "Lenient: uniqueItems")
    page.wait_for_selector("#lint[data-state=ok] .ignored")
    assert page.inner_text("#lint .ignored") == "/properties/tags/uniqueItems"
    page.check("#strict")
    page.wait_for_selector("#lint[data-state=ok] .checked")
    assert page.inner_text("#lint .checked") == "uniqueItems at /properties/tags/uniqueItems on /tags"

    assert sent == []
    assert console.errors() == []


def test_api_key_is_asked_once_and_kept_behind_a_prefix(
    keyed_server: RunningServer, page: Any, console: Any
) -> None:
    # Behind a proxy at /ts (no trailing slash): every call must go through the prefix.
    url = keyed_server.url + PREFIX
    page.goto(url)
    page.wait_for_selector("#key-dialog[open]")
    page.fill("#key-input", "wrong-key")
    page.click("#key-save")
    page.wait_for_selector("#key-error:not([hidden])")
    assert "refused" in page.inner_text("#key-error")

    page.fill("#key-input", API_KEY)
    page.click("#key-save")
    page.wait_for_selector("#model[data-ready=true]")
    assert page.evaluate("sessionStorage.getItem('thinkstruct.apiKey')") == API_KEY
    assert page.inner_text("#key-status") == "API key set"

    # A reload in the same tab keeps the key: no dialog, straight to a short constrained answer.
    page.reload()
    page.wait_for_selector("#model[data-ready=true]")
    assert not page.is_visible("#key-dialog")
    _pick(page, "choice", "Capital")
    page.wait_for_selector("#lint[data-state=ok]")
    page.uncheck("#thinking")
    page.fill("#max-tokens", "8")
    page.click("#send")
    page.wait_for_selector("#verdict:not([data-state=none])")
    assert page.get_attribute("#verdict", "data-state") == "valid"
    assert page.inner_text("#answer") in ("Paris", "London", "Berlin", "Madrid")
    assert page.locator("#plot circle.pt").count() == int(page.inner_text("#s-tokens"))
    assert page.locator("#plot circle.pt.thought").count() == 0

    # The only errors: the browser's own note of the refused wrong key.
    assert console.errors(allow=("401",)) == []
