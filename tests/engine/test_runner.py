"""The slot KV cache runner against transformers' own forward pass.

Whatever the schedule — rows joining into free slots, feeding one token or several in a
pass, next to rows of other lengths, moved to another slot when a row before them
leaves — each row's logits must be those of running its whole token sequence alone
through the plain model.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thinkstruct.engine.runner import TransformersRunner

SLOTS = 4


def reference_logits(model, ids: list[int]) -> torch.Tensor:
    """Logits of the last token of ``ids``, from a fresh full forward pass."""
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0, -1].float()


def _runner(tiny_model) -> TransformersRunner:
    return TransformersRunner(tiny_model.model, slots=SLOTS, context_length=tiny_model.context_length)


def test_rows_of_different_lengths_match_the_plain_model(tiny_model) -> None:
    runner = _runner(tiny_model)
    plain = tiny_model.model
    rows = [[5, 6, 7], [100, 200], [9, 8, 7, 6, 5, 4, 3]]
    with torch.inference_mode():
        for slot, ids in enumerate(rows):
            got = runner.forward(slot, [ids], [0])[0]
            torch.testing.assert_close(got, reference_logits(plain, ids), rtol=1e-4, atol=1e-4)
        # One pass: row 0 feeds one token, row 1 three (a sampled token plus forced ones),
        # row 2 two, each from its own position.
        feeds = [[11], [12, 13, 14], [15, 16]]
        got = runner.forward(0, feeds, [len(r) for r in rows])
    for i, (ids, feed) in enumerate(zip(rows, feeds)):
        torch.testing.assert_close(got[i], reference_logits(plain, ids + feed), rtol=1e-4, atol=1e-4)


def test_a_row_moved_to_another_slot_keeps_its_cache(tiny_model) -> None:
    runner = _runner(tiny_model)
    with torch.inference_mode():
        runner.forward(2, [[1, 2, 3, 4]], [0])
        runner.copy_slot(2, 0, 4)
        got = runner.forward(0, [[5]], [4])[0]
    torch.testing.assert_close(got, reference_logits(tiny_model.model, [1, 2, 3, 4, 5]), rtol=1e-4, atol=1e-4)


def test_buffers_grow_past_the_initial_capacity(tiny_model) -> None:
    runner = _runner(tiny_model)
    ids = [(i * 7919) % 5000 + 10 for i in range(300)]  # longer than INITIAL_CAPACITY
    with torch.inference_mode():
        runner.forward(0, [ids[:200]], [0])
        got = runner.forward(0, [ids[200:]], [200])[0]
    assert runner.cache.capacity >= 300
    torch.testing.assert_close(got, reference_logits(tiny_model.model, ids), rtol=1e-4, atol=1e-4)


token = st.integers(min_value=2, max_value=120_000)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_schedule_matches_the_plain_model(tiny_model, data) -> None:
    """A random schedule of joins, multi-token feeds and leaves (with compaction)."""
    runner = _runner(tiny_model)
    plain = tiny_model.model
    live: list[list[int]] = []  # live[slot] = the tokens that slot holds
    with torch.inference_mode():
        for _ in range(data.draw(st.integers(2, 6), label="rounds")):
            action = data.draw(st.sampled_from(["join", "step", "leave"]))
            if action == "join" and len(live) < SLOTS:
                ids = data.draw(st.lists(token, min_size=1, max_size=12), label="prompt")
                got = runner.forward(len(live), [ids], [0])[0]
                live.append(ids)
                torch.testing.assert_close(got, reference_logits(plain, ids), rtol=1e-4, atol=1e-4)
            elif action == "leave" and live:
                gone = data.draw(st.integers(0, len(live) - 1), label="leaving")
                last = len(live) - 1
                if gone != last:  # the scheduler moves the last row into the hole
                    runner.copy_slot(last, gone, len(live[last]))
                    live[gone] = live[last]
                live.pop()
            elif live:
                feeds = [data.draw(st.lists(token, min_size=1, max_size=4), label="feed") for _ in live]
                got = runner.forward(0, feeds, [len(r) for r in live])
                for i, feed in enumerate(feeds):
                    live[i] = live[i] + feed
                    torch.testing.assert_close(got[i], reference_logits(plain, live[i]), rtol=1e-4, atol=1e-4)


def test_the_model_stays_correct_outside_the_runner(tiny_model) -> None:
    """The runner switches the model to its attention; a padded batch run the ordinary
    way must still give each row its own logits."""
    _runner(tiny_model)
    rows = [[3, 4, 5, 6], [7, 8]]
    ids = torch.tensor([rows[0], [1, 1, *rows[1]]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        out = (
            tiny_model.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1].float()
        )
    import copy

    plain = copy.deepcopy(tiny_model.model)
    plain.set_attn_implementation("sdpa")
    for i, row in enumerate(rows):
        torch.testing.assert_close(out[i], reference_logits(plain, row), rtol=1e-4, atol=1e-4)
