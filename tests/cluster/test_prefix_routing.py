"""The routing decision without a Ray cluster: the prefix index the router keeps (block
and tail keys, every replica that holds a prefix) and the ranking of replicas under the
load bound, from plain data."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thinkstruct.server.cluster.affinity import LoadBound, rank_replicas
from thinkstruct.server.cluster.prefix_index import PrefixIndex, PromptKeys, block_keys

tokens = st.lists(st.integers(min_value=0, max_value=200_000), max_size=80)
# Few distinct token values: prompts that share prefixes, of every length around a block.
alike = st.lists(st.integers(min_value=0, max_value=2), max_size=14)


@given(tokens, tokens)
def test_block_keys_agree_exactly_on_the_shared_whole_blocks(a: list[int], b: list[int]) -> None:
    shared = 0
    while shared < min(len(a), len(b)) and a[shared] == b[shared]:
        shared += 1
    ka, kb = block_keys(a, block=4), block_keys(b, block=4)
    assert (len(ka), len(kb)) == (len(a) // 4, len(b) // 4)
    agreeing = sum(1 for x, y in zip(ka, kb, strict=False) if x == y)
    assert agreeing == min(shared // 4, len(ka), len(kb))


@given(st.lists(st.tuples(alike, st.sampled_from("abc")), max_size=12), alike)
def test_the_index_names_the_replicas_holding_the_longest_prefix(
    served: list[tuple[list[int], str]], prompt: list[int]
) -> None:
    index = PrefixIndex[str]()
    # A brute-force model: each prefix a replica holds (its prompts' whole blocks and the
    # prompts themselves), and when each replica last took it.
    held: dict[tuple[int, ...], dict[str, int]] = {}
    for when, (ids, replica) in enumerate(served):
        index.record(PromptKeys.of(ids, block=4), replica)
        for end in [*range(4, len(ids) + 1, 4), len(ids)]:
            if end:
                held.setdefault(tuple(ids[:end]), {})[replica] = when
    among = {"a", "b"}
    got = index.longest(PromptKeys.of(prompt, block=4), among=among)
    depth = 0  # whole blocks of the prompt anyone holds, from the start
    while depth * 4 + 4 <= len(prompt) and tuple(prompt[: depth * 4 + 4]) in held:
        depth += 1
    lengths = list(range(4, depth * 4 + 1, 4))  # whole blocks
    lengths += [depth * 4 + t for t in range(1, 4) if depth * 4 + t <= len(prompt)]  # a tail after them
    reachable = [n for n in lengths if set(held.get(tuple(prompt[:n]), {})) & among]
    if not reachable:
        assert (got.holders, got.tokens) == ((), 0)
        return
    best = max(reachable)
    holders = {r: when for r, when in held[tuple(prompt[:best])].items() if r in among}
    assert got.tokens == best
    assert got.holders == tuple(sorted(holders, key=holders.__getitem__))


def test_a_second_turn_is_told_apart_by_its_first_turns_whole_prompt() -> None:
    """Chats that share a long system prompt and ask short, different first questions (no
    whole block of their own): each second turn finds its own first turn's replica."""
    system = list(range(1000, 1400))  # 25 blocks of 16
    index = PrefixIndex[str]()
    firsts = {}
    for chat in range(12):
        first = [*system, 7, chat, 8]  # the question: 3 tokens
        replica = "ab"[chat % 2]
        index.record(PromptKeys.of(first), replica)
        firsts[chat] = (first, replica)
    for chat, (first, replica) in firsts.items():
        second = [*first, 50 + chat, 51, 52, 9, 7, 53]  # the answer, the next question
        match = index.longest(PromptKeys.of(second), among={"a", "b"})
        assert (match.holders, match.tokens) == ((replica,), len(first))
    shared = index.longest(PromptKeys.of([*system, 7, 99]), among={"a", "b"})
    assert set(shared.holders) == {"a", "b"} and shared.tokens == len(system)


def test_a_forgotten_replica_holds_nothing_and_the_index_stays_bounded() -> None:
    index = PrefixIndex[str](max_keys=10)
    index.record(PromptKeys.of(list(range(64)), block=4), "a")
    assert len(index) == 10  # the deepest blocks went first
    assert index.longest(PromptKeys.of(list(range(64)), block=4), among={"a"}).tokens == 40
    index.record(PromptKeys.of(list(range(9)), block=4), "b")
    both = index.longest(PromptKeys.of(list(range(9)), block=4), among={"a", "b"})
    assert (both.holders, both.tokens) == (("b",), 9)  # its tail: b alone took all 9
    index.forget("b")
    alone = index.longest(PromptKeys.of(list(range(9)), block=4), among={"a", "b"})
    assert (alone.holders, alone.tokens) == (("a",), 8)


loads = st.dictionaries(st.sampled_from("abcde"), st.integers(min_value=0, max_value=60), min_size=1)
bounds = st.builds(
    LoadBound, requests=st.integers(min_value=0, max_value=8), ratio=st.floats(min_value=1, max_value=3)
)


@given(loads, st.sets(st.sampled_from("abcdef")), bounds, st.integers())
def test_the_ranking_prefers_a_holder_within_the_bound_and_else_the_least_busy(
    load: dict[str, int], holders: set[str], bound: LoadBound, seed: int
) -> None:
    order = rank_replicas(
        list(load), holders=holders, load=load.__getitem__, bound=bound, rng=random.Random(seed)
    )
    assert sorted(order) == sorted(load)
    least = min(load.values())
    first = order[0]
    assert bound.allows(load[first], least)  # never past the bound
    assert [load[r] for r in order[1:]] == sorted(load[r] for r in order[1:])
    allowed = [r for r in load if r in holders and bound.allows(load[r], least)]
    if allowed:
        assert first in holders and load[first] == min(load[r] for r in load if r in holders)
    else:
        assert load[first] == least


@given(bounds, st.integers(min_value=2, max_value=4), st.integers(min_value=1, max_value=80), st.integers())
def test_a_popular_prefix_spreads_within_the_bound(
    bound: LoadBound, replicas: int, requests: int, seed: int
) -> None:
    """Requests that all share one system prompt, sent at once (none finishes meanwhile)."""
    rng = random.Random(seed)
    names = [f"r{i}" for i in range(replicas)]
    index = PrefixIndex[str]()
    load: Counter[str] = Counter()
    system = list(range(2000, 2300))
    for i in range(requests):
        prompt = PromptKeys.of([*system, 5, i])
        holders = index.longest(prompt, among=set(names)).holders
        chosen = rank_replicas(names, holders=holders, load=load.__getitem__, bound=bound, rng=rng)[0]
        least = min(load[r] for r in names)
        assert load[chosen] - least <= max(bound.requests, (bound.ratio - 1) * least)
        index.record(prompt, chosen)
        load[chosen] += 1
    least = min(load[r] for r in names)
    assert max(load.values()) - least <= max(bound.requests, (bound.ratio - 1) * least) + 1


@pytest.mark.parametrize("chats", [12, 64])
def test_concurrent_conversations_keep_their_replicas(chats: int) -> None:
    """First turns sent at once on two replicas (one system prompt for all, each its own
    short question), then every second turn while all are in flight: each goes back."""
    rng = random.Random(chats)
    names = ["a", "b"]
    bound = LoadBound()
    index = PrefixIndex[str]()
    load: Counter[str] = Counter()
    system = list(range(3000, 3400))
    firsts = []
    for chat in range(chats):
        prompt = [*system, 11, chat]
        holders = index.longest(PromptKeys.of(prompt), among=set(names)).holders
        chosen = rank_replicas(names, holders=holders, load=load.__getitem__, bound=bound, rng=rng)[0]
        index.record(PromptKeys.of(prompt), chosen)
        load[chosen] += 1
        firsts.append((prompt, chosen))
    assert min(load.values()) >= 1
    second: Counter[str] = Counter()
    for chat, (prompt, replica) in enumerate(firsts):
        turn = PromptKeys.of([*prompt, 40 + chat % 7, 41, 12, chat])
        holders = index.longest(turn, among=set(names)).holders
        assert holders == (replica,)
        assert (
            rank_replicas(names, holders=holders, load=second.__getitem__, bound=bound, rng=rng)[0] == replica
        )
        second[replica] += 1


def test_a_load_bound_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="ratio >= 1"):
        LoadBound(requests=4, ratio=0.5)
    with pytest.raises(ValueError, match="requests >= 0"):
        LoadBound(requests=-1)
    assert LoadBound(requests=4, ratio=1.5).allows(30, 21)  # 9 more, but under 1.5x
    assert not LoadBound(requests=4, ratio=1.5).allows(8, 3)


def test_serve_passes_the_routing_choice_to_the_cluster(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from thinkstruct.cli import main
    from thinkstruct.server.cluster import service

    got: list[service.ClusterOptions] = []
    monkeypatch.setattr(service, "serve_cluster", lambda *args, **kwargs: got.append(args[2]) or 0)
    assert main(["serve", "--replicas", "2", "--routing", "queue"]) == 0
    assert main(["serve", "--replicas", "2"]) == 0
    assert [options.routing for options in got] == ["queue", "prefix"]
    with pytest.raises(SystemExit):
        main(["serve", "--replicas", "2", "--routing", "sticky"])
    assert "invalid choice: 'sticky'" in capsys.readouterr().err
