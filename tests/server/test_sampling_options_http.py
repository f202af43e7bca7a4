"""logprobs / top_logprobs, logit_bias, presence / frequency / repetition penalties and min_p
over HTTP with the official ``openai`` client, on the tiny model (its random logits are
small, so a penalty of 2 or a bias of 100 decides every pick)."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from server_harness import RunningServer

NO_THOUGHT = {"chat_template_kwargs": {"thinking": False}}
MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def model(tiny_server: RunningServer) -> str:
    return str(tiny_server.state.model_name)


@pytest.fixture(scope="module")
def hello_id(tiny_engine: Any) -> int:
    """A plain word's token id."""
    return int(tiny_engine.model.tokenizer.encode(" hello")[0])


def _chat(client: openai.OpenAI, model: str, **kwargs: Any) -> Any:
    extra = {**NO_THOUGHT, **kwargs.pop("extra_body", {})}
    return client.chat.completions.create(model=model, messages=MESSAGES, extra_body=extra, **kwargs)


def _streamed_chat(client: openai.OpenAI, model: str, **kwargs: Any) -> tuple[str, list[Any]]:
    text, entries = "", []
    for chunk in _chat(client, model, stream=True, **kwargs):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs is not None:
                entries.extend(choice.logprobs.content or [])
    return text, entries


def test_chat_logprobs_line_up_with_the_content(tiny: openai.OpenAI, model: str) -> None:
    answer = _chat(tiny, model, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    choice = answer.choices[0]
    entries = choice.logprobs.content
    assert len(entries) == answer.usage.completion_tokens
    assert bytes(b for e in entries for b in e.bytes).decode() == choice.message.content
    for entry in entries:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token  # greedy took the most likely
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)
        assert entry.logprob <= 0
    # Streamed: the same tokens, chunk by chunk.
    text, streamed = _streamed_chat(tiny, model, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    assert text == choice.message.content
    assert [e.token for e in streamed] == [e.token for e in entries]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in entries], abs=1e-4)


def test_without_logprobs_there_are_none(tiny: openai.OpenAI, model: str) -> None:
    answer = _chat(tiny, model, max_tokens=3)
    assert answer.choices[0].logprobs is None
    for chunk in _chat(tiny, model, max_tokens=3, stream=True):
        assert all(c.logprobs is None for c in chunk.choices)


@pytest.mark.parametrize("stream", [False, True])
def test_a_constrained_answer_lists_only_allowed_tokens(
    tiny: openai.OpenAI, model: str, stream: bool
) -> None:
    choices = ["yes", "no", "maybe later"]
    kwargs: dict[str, Any] = {
        "max_tokens": 12,
        "seed": 7,
        "logprobs": True,
        "top_logprobs": 20,
        "extra_body": {"choice": choices},
    }
    if stream:
        content, entries = _streamed_chat(tiny, model, **kwargs)
    else:
        answer = _chat(tiny, model, **kwargs)
        content, entries = answer.choices[0].message.content, answer.choices[0].logprobs.content
    assert content in choices
    written = ""
    for entry in entries:
        assert entry.top_logprobs
        for alternative in entry.top_logprobs:  # every listed token keeps the answer possible
            assert any(c.startswith(written + alternative.token) for c in choices), alternative.token
        written += entry.token
    assert written == content


def test_the_thought_has_its_own_logprobs(tiny: openai.OpenAI, model: str) -> None:
    answer = tiny.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=20,
        seed=3,
        logprobs=True,
        extra_body={
            "chat_template_kwargs": {"thinking": True},
            "max_reasoning_tokens": 4,
            "choice": ["a", "b"],
        },
    )
    choice = answer.choices[0]
    logprobs = choice.logprobs.model_dump()
    assert logprobs["reasoning_content"]
    assert len(logprobs["reasoning_content"]) == answer.usage.completion_tokens_details.reasoning_tokens
    assert "".join(e["token"] for e in logprobs["content"]) == choice.message.content


def test_logit_bias_steers_the_answer(tiny: openai.OpenAI, model: str, hello_id: int) -> None:
    answer = _chat(tiny, model, max_tokens=4, temperature=0, logit_bias={str(hello_id): 100})
    assert answer.choices[0].message.content == " hello" * 4
    streamed, _ = _streamed_chat(tiny, model, max_tokens=4, temperature=0, logit_bias={str(hello_id): 100})
    assert streamed == " hello" * 4
    text = tiny.completions.create(
        model=model, prompt="x", max_tokens=3, temperature=0, logit_bias={str(hello_id): 100}
    )
    assert text.choices[0].text == " hello" * 3


def test_penalties_change_what_repeats(tiny: openai.OpenAI, model: str) -> None:
    def tokens(**kwargs: Any) -> list[str]:
        answer = tiny.completions.create(
            model=model, prompt="x y", max_tokens=10, temperature=0, logprobs=0, **kwargs
        )
        return list(answer.choices[0].logprobs.tokens)

    assert len(set(tokens(frequency_penalty=-2))) == 1
    fresh = tokens(presence_penalty=2)
    assert len(set(fresh)) == len(fresh)
    novel = tokens(extra_body={"repetition_penalty": 1e6})
    assert len(set(novel)) == len(novel)
    greedy = _chat(tiny, model, max_tokens=6, temperature=0).choices[0].message.content
    pruned = _chat(tiny, model, max_tokens=6, temperature=1.5, seed=11, extra_body={"min_p": 1.0})
    assert pruned.choices[0].message.content == greedy


def test_completion_logprobs_in_the_legacy_shape(tiny: openai.OpenAI, model: str) -> None:
    answer = tiny.completions.create(
        model=model, prompt="ab", max_tokens=5, temperature=0, logprobs=2, echo=True
    )
    choice = answer.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert lp.text_offset[0] == len("ab")  # after the echoed prompt
    generated = choice.text[len("ab") :]
    assert "".join(lp.tokens) == generated
    for i, token in enumerate(lp.tokens):
        assert choice.text[lp.text_offset[i] : lp.text_offset[i] + len(token)] == token
        assert token in lp.top_logprobs[i] and len(lp.top_logprobs[i]) <= 3  # the top 2 and the sampled one
        assert max(lp.top_logprobs[i].values()) == pytest.approx(lp.token_logprobs[i])  # greedy
    streamed = tiny.completions.create(
        model=model, prompt="ab", max_tokens=5, temperature=0, logprobs=2, echo=True, stream=True
    )
    pieces = [c.choices[0].logprobs for c in streamed if c.choices and c.choices[0].logprobs]
    assert [t for p in pieces for t in p.tokens] == lp.tokens
    assert [o for p in pieces for o in p.text_offset] == lp.text_offset


def _assert_400(call: Any, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    error = caught.value.body
    assert isinstance(error, dict) and error.get("param") == param, error


def test_bad_values_are_400s_naming_the_field(tiny: openai.OpenAI, model: str, tiny_engine: Any) -> None:
    vocab = tiny_engine.model.tokenizer.vocab_size
    chat_cases: dict[str, dict[str, Any]] = {
        "top_logprobs": {"logprobs": True, "top_logprobs": 21},
        "logit_bias.abc": {"logit_bias": {"abc": 1}},
        "logit_bias.5": {"logit_bias": {"5": 101}},
        f"logit_bias.{vocab}": {"logit_bias": {str(vocab): 1}},
        "presence_penalty": {"presence_penalty": 2.5},
        "frequency_penalty": {"frequency_penalty": -3},
        "repetition_penalty": {"extra_body": {"repetition_penalty": 0}},
        "min_p": {"extra_body": {"min_p": 1.5}},
    }
    for param, kwargs in chat_cases.items():
        _assert_400(lambda kwargs=kwargs: _chat(tiny, model, max_tokens=2, **kwargs), param)
    _assert_400(lambda: _chat(tiny, model, max_tokens=2, top_logprobs=2), "top_logprobs")
    _assert_400(
        lambda: tiny.completions.create(model=model, prompt="x", max_tokens=2, logprobs=6), "logprobs"
    )
    _assert_400(
        lambda: tiny.completions.create(
            model=model, prompt="x", max_tokens=2, extra_body={"top_logprobs": 2}
        ),
        "top_logprobs",
    )
