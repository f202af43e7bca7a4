"""The routing decision without a Ray cluster: the prefix index the router keeps (block
and tail keys, every replica that holds a prefix) and the ranking of replicas under the
load bound, from plain data."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thinkstruct.server.cluster.affinity import Bounds, InFlight, LoadBound, rank_replicas
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
        assert (got.holders, got.tokens, got.whole) == ((), 0, False)
        return
    best = max(reachable)
    holders = {r: when for r, when in held[tuple(prompt[:best])].items() if r in among}
    assert got.tokens == best
    assert got.holders == tuple(sorted(holders, key=holders.__getitem__))
    # Whole: the match is a prompt served before that this one goes on from, not only a
    # prefix of longer ones, nor the same prompt again.
    earlier = tuple(prompt[:best]) in {tuple(ids) for ids, _ in served}
    assert got.whole == (earlier and best < len(prompt))


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
        assert (match.holders, match.tokens, match.whole) == ((replica,), len(first), True)
    shared = index.longest(PromptKeys.of([*system, 7, 99]), among={"a", "b"})
    assert set(shared.holders) == {"a", "b"} and shared.tokens == len(system) and not shared.whole


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


def route(index: PrefixIndex[str], load: Counter[str], prompt: list[int], rng: random.Random) -> str:
    """Where the router sends ``prompt`` (the index and the loads as given), recorded there."""
    names = sorted(load)
    keys = PromptKeys.of(prompt)
    match = index.longest(keys, among=set(names))
    bound = Bounds().of(whole=match.whole)
    chosen = rank_replicas(names, holders=match.holders, load=load.__getitem__, bound=bound, rng=rng)[0]
    index.record(keys, chosen)
    load[chosen] += 1
    return chosen


def first_turns(
    chats: int, replicas: int, seed: int
) -> tuple[PrefixIndex[str], Counter[str], list[tuple[list[int], str]]]:
    """``chats`` first turns sharing one system prompt (each its own short question), sent
    at once: none finishes meanwhile. The index, the loads and each turn's prompt and replica."""
    rng = random.Random(seed)
    index = PrefixIndex[str]()
    load = Counter({f"r{i}": 0 for i in range(replicas)})
    system = list(range(3000, 3400))
    turns = []
    for chat in range(chats):
        prompt = [*system, 11, chat]
        turns.append((prompt, route(index, load, prompt, rng)))
    return index, load, turns


@given(st.integers(min_value=1, max_value=80), st.integers(min_value=2, max_value=4), st.integers())
def test_first_turns_sharing_a_prompt_split_evenly(chats: int, replicas: int, seed: int) -> None:
    """A match that is only a shared prefix takes its holder only while that holder is at
    most one request busier than the least busy replica: never more than two apart."""
    _, load, turns = first_turns(chats, replicas, seed)
    counts = Counter(replica for _, replica in turns)
    assert counts == load
    assert max(load.values()) - min(load.values()) <= Bounds().shared.requests + 1


def test_first_turns_sharing_a_prompt_piled_up_under_one_bound() -> None:
    """The same first turns where a shared prefix had the conversations' bound: its
    first holder took 4 more than the other (why the shared prefix has its own)."""
    rng = random.Random(12)
    index = PrefixIndex[str]()
    load = Counter({"a": 0, "b": 0})
    system = list(range(3000, 3400))
    for chat in range(12):
        keys = PromptKeys.of([*system, 11, chat])
        holders = index.longest(keys, among={"a", "b"}).holders
        chosen = rank_replicas(
            ["a", "b"], holders=holders, load=load.__getitem__, bound=Bounds().whole, rng=rng
        )[0]
        index.record(keys, chosen)
        load[chosen] += 1
    assert max(load.values()) - min(load.values()) >= 4


def test_the_same_prompt_sent_at_once_spreads_like_a_shared_prefix() -> None:
    """Twelve identical prompts at once (samples of one request): each after the first
    matches a whole earlier prompt but does not go on past it, so the tight bound holds."""
    rng = random.Random(3)
    index = PrefixIndex[str]()
    load = Counter({"a": 0, "b": 0})
    prompt = [*range(5000, 5300), 7]
    assert {route(index, load, prompt, rng) for _ in range(12)} == {"a", "b"}
    assert max(load.values()) - min(load.values()) <= Bounds().shared.requests + 1
    assert index.longest(PromptKeys.of(prompt), among={"a", "b"}).whole is False
    assert index.longest(PromptKeys.of([*prompt, 8]), among={"a", "b"}).whole is True


@pytest.mark.parametrize("chats", [12, 64])
def test_concurrent_conversations_keep_their_replicas(chats: int) -> None:
    """First turns sent at once on two replicas (one system prompt for all), then every
    second turn once all first turns have finished: each goes back."""
    index, _, turns = first_turns(chats, 2, seed=chats)
    second = Counter({"r0": 0, "r1": 0})
    rng = random.Random(chats)
    for chat, (prompt, replica) in enumerate(turns):
        assert route(index, second, [*prompt, 40 + chat % 7, 41, 12, chat], rng) == replica


def test_the_last_replica_to_finish_keeps_its_second_turns() -> None:
    """12 chats sharing a system prompt: one replica has finished both turns of all its
    chats (idle) while the other's first turns end one by one, each followed at once by
    its second turn: the busy replica keeps every one (a conversation's earlier turn has
    the looser bound), where a new chat's first turn goes to the idle replica."""
    index, load, turns = first_turns(12, 2, seed=7)
    busy, idle = load.most_common()[0][0], load.most_common()[1][0]
    load[idle] = 0
    rng = random.Random(7)
    for chat, (prompt, replica) in enumerate(turns):
        if replica != busy:
            continue
        load[busy] -= 1  # its first turn ends
        assert route(index, load, [*prompt, 40, 41, 12, chat], rng) == busy
    assert load[busy] - load[idle] > 4  # past the bound a shared prefix has
    assert route(index, load, [*list(range(3000, 3400)), 11, 99], rng) == idle


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_ranked_before_any_is_sent_splits_evenly() -> None:
    """Twelve requests ranked one after another before any is accepted: each choice
    counts at once, so the loads the next one sees include it."""
    clock = Clock()
    in_flight = InFlight[str](clock=clock)
    rng = random.Random(5)
    for request in range(12):
        first = rank_replicas(["a", "b"], holders=(), load=in_flight, bound=Bounds().shared, rng=rng)[0]
        in_flight.chose(f"q{request}", first)
    assert (in_flight("a"), in_flight("b")) == (6, 6)
    for request in range(12):  # accepted where chosen, or elsewhere
        in_flight.accepted(f"q{request}", "a" if request < 8 else "b")
    assert (in_flight("a"), in_flight("b")) == (8, 4)
    for request in range(12):
        in_flight.finished(f"q{request}")
    assert (in_flight("a"), in_flight("b")) == (0, 0)


def test_a_choice_counts_once_and_one_never_accepted_stops_counting() -> None:
    clock = Clock()
    in_flight = InFlight[str](choice_ttl_s=5.0, clock=clock)
    in_flight.chose("q", "a")
    in_flight.chose("q", "b")  # ranked again after a backoff: the last choice counts
    assert (in_flight("a"), in_flight("b")) == (0, 1)
    in_flight.finished("q")  # cancelled before any replica took it
    assert in_flight("b") == 0
    in_flight.chose("lost", "a")  # cancelled, and no end is ever reported
    clock.now = 4.0
    in_flight.chose("r", "a")
    assert in_flight("a") == 2
    clock.now = 6.0
    in_flight.chose("s", "b")  # the choice of "lost" is 6 s old: it no longer counts
    assert (in_flight("a"), in_flight("b")) == (1, 1)
    in_flight.accepted("r", "a")
    in_flight.accepted("r", "a")  # told twice: counted once
    assert in_flight("a") == 1


def test_a_load_bound_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="ratio >= 1"):
        LoadBound(requests=4, ratio=0.5)
    with pytest.raises(ValueError, match="requests >= 0"):
        LoadBound(requests=-1, ratio=1.5)
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
