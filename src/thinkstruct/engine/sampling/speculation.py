"""Speculative decoding without a draft model: prompt-lookup n-gram drafts.

Structured answers repeat their context: an extraction copies fields of the document, a
tool call repeats names and values from the conversation, JSON keys come back. The last
few tokens of a request, looked up in what it has seen (its prompt and its answer so
far), often continue as they did the last time. :class:`NgramDrafter` proposes that
continuation; the engine feeds it after the row's own token in the same pass, gets the
logits of every fed position, and keeps the draft's tokens as long as each is what the
row would have sampled there, or what its grammar forces after that (one draw of the
row's own generator per sampled position, as without a draft). For a deterministic draft that is exactly the standard acceptance rule
(accept with the target probability, else draw from the rest), so the output
distribution is unchanged, and on a batch-invariant runner a seed gives the very same
tokens with and without speculation.

A pass over one row's 1 + k positions costs about what a pass over one does only while
the weight reads dominate: past a few positions a CPU's arithmetic does (on two cores with
AVX-512, 4 positions cost about 1.3 passes of one, 8 about 1.9: measured on SmolLM2's int8
weights). So a row drafts as far as it pays: each draft token has odds of being kept (the
row's own record for draft tokens from suffix matches of that length and for the pair of
tokens it continues, from a prior; 1 for a token the grammar forces), and :func:`draft_lengths` cuts the drafts where the expected
tokens per unit of pass cost are highest, which is no draft at all where the odds are
poor (free text pays almost nothing for trying).

A request's own record is short (a hundred tokens of free text check a few dozen draft
tokens), so its drafter starts from the engine's (:class:`DraftRecord`): how draft tokens
of each class fared over the recent requests, kept apart for rows under a grammar and
free ones. Free text's one-token matches, kept about one time in five, then stop being
drafted after the first requests, while an extraction's, kept one time in two, go on.

What a pass over more positions costs depends on the machine (on one measured here 8
positions cost 1.7 passes of one, on another 2.2), so the engine measures it:
:class:`PassCosts` keeps each decoding step's seconds by the positions it fed and answers
with those, and with :func:`pass_cost`'s model (the config's) for a size not yet measured.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thinkstruct.grammar.runtime.matcher import GrammarMatcher

__all__ = ["DraftRecord", "NgramDrafter", "PassCosts", "SpeculationConfig", "draft_lengths", "pass_cost"]


@dataclass(frozen=True, kw_only=True)
class SpeculationConfig:
    """When and how much to draft.

    Attributes:
        max_draft: most tokens proposed a step (before :func:`draft_lengths` cuts).
        min_ngram, max_ngram: lengths of the suffix looked up, longest first.
        max_batch: speculate only while at most this many rows decode (a larger batch
            is already bound by arithmetic, not weight bytes: extra positions cost).
        free_positions, position_cost: a pass over ``m`` positions costs
            ``1 + position_cost * max(0, m - free_positions)`` passes of one
            (:func:`pass_cost`; the defaults fit SmolLM2-135M's int8 weights on two
            cores) until :class:`PassCosts` has measured it.
        measured_costs: draft by the costs the engine measures (:class:`PassCosts`);
            ``False``: by the model above only.
        prior: odds that a draft token is kept, by the length of the suffix match it
            follows from (1, 2, ... tokens; the last entry for longer ones), before the
            engine has a record (:class:`DraftRecord`).
        prior_weight: how many of its own draft tokens a row's record needs to weigh as
            much as the engine's odds.
        after_forced: how many tokens a row took after the grammar's last forced run are
            kept to draft after the next one where the lookup has nothing the grammar
            allows (a JSON key is forced, the ``": "`` after it is not).
        after_forced_prior: the odds of those tokens, before the row's own record.
    """

    max_draft: int = 12
    min_ngram: int = 1
    max_ngram: int = 6
    max_batch: int = 4
    free_positions: float = 1.5
    position_cost: float = 0.14
    prior: tuple[float, ...] = (0.3, 0.45, 0.65, 0.75, 0.8, 0.85)
    prior_weight: float = 4.0
    after_forced: int = 2
    after_forced_prior: float = 0.9
    measured_costs: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram or self.max_draft < 1 or self.max_batch < 1:
            raise ValueError("need 1 <= min_ngram <= max_ngram, max_draft >= 1 and max_batch >= 1")
        if self.free_positions < 1 or self.position_cost < 0:
            raise ValueError("need free_positions >= 1 and position_cost >= 0")
        if not self.prior or not all(0.0 <= p <= 1.0 for p in (*self.prior, self.after_forced_prior)):
            raise ValueError("prior and after_forced_prior need odds in [0, 1]")
        if self.prior_weight <= 0 or self.after_forced < 0:
            raise ValueError("need prior_weight > 0 and after_forced >= 0")


def pass_cost(positions: float, config: SpeculationConfig) -> float:
    """What a pass over ``positions`` positions costs, in passes over one."""
    return 1.0 + config.position_cost * max(0.0, positions - config.free_positions)


class PassCosts:
    """What a decoding pass over ``n`` positions costs on this machine, in passes over
    one: measured where steps of that size have run, else :func:`pass_cost`'s model.

    :meth:`observe` takes each decoding step's wall seconds with the positions it fed
    (only steps of at most ``config.max_batch`` rows, the ones that draft; the first
    ``samples`` of a size averaged, then a moving average weighing the newest by
    ``weight``). A size counts once it has ``samples`` steps; the unit (a pass over
    one) is the smallest counted size's seconds over its modelled cost, so measured sizes
    compare exactly with one another and the model scales to them. A larger pass never
    costs less than a smaller one (the table is made non-decreasing: noise must not make
    longer drafts look free).

    Args:
        config: the model for sizes not measured yet.
        most: the largest size kept (larger passes are not recorded; they cost as
            modelled, at least as much as the largest measured).
        samples, weight: see above.
    """

    def __init__(
        self, config: SpeculationConfig, *, most: int = 64, samples: int = 4, weight: float = 0.1
    ) -> None:
        if most < 1 or samples < 1 or not 0.0 < weight <= 1.0:
            raise ValueError("need most >= 1, samples >= 1 and 0 < weight <= 1")
        self._config = config
        self._samples = samples
        self._weight = weight
        self._seconds = [0.0] * (most + 1)
        self._count = [0] * (most + 1)
        self._table: list[float] | None = None

    def observe(self, positions: int, seconds: float, *, rows: int = 1) -> None:
        """A decoding step of ``rows`` rows fed ``positions`` positions in ``seconds`` seconds
        (under a nanosecond, or not a number: not a measurement; a unit that small would
        round to zero)."""
        if rows > self._config.max_batch or not 1 <= positions < len(self._count) or not seconds >= 1e-9:
            return
        n = self._count[positions]
        old = self._seconds[positions]
        if n < self._samples:
            self._seconds[positions] = old + (seconds - old) / (n + 1)
        else:
            self._seconds[positions] = old + self._weight * (seconds - old)
        self._count[positions] = n + 1
        self._table = None

    def cost(self, positions: float) -> float:
        """A pass over ``positions`` positions, in passes over one."""
        table = self._table if self._table is not None else self._build()
        p = int(positions)
        if p < len(table):
            return table[max(p, 0)]
        return max(table[-1], pass_cost(positions, self._config))

    def _build(self) -> list[float]:
        config, counted = self._config, self._count
        sizes = [p for p in range(1, len(counted)) if counted[p] >= self._samples]
        unit = self._seconds[sizes[0]] / pass_cost(sizes[0], config) if sizes else 0.0
        measured = set(sizes)
        table, floor = [], 0.0
        for p in range(len(counted)):
            here = self._seconds[p] / unit if p in measured else pass_cost(max(p, 1), config)
            floor = max(floor, here)
            table.append(floor)
        self._table = table
        return table


def draft_lengths(
    odds: Sequence[Sequence[float]],
    *,
    positions: int,
    rows: int,
    config: SpeculationConfig,
    costs: PassCosts | None = None,
) -> list[int]:
    """How much of each row's draft to feed: draft ``i``'s token ``j`` is kept with odds
    ``odds[i][j]`` once the tokens before it are; the pass feeds ``positions`` positions
    without drafts and yields ``rows`` tokens. Row by row, the length with the most
    expected tokens per unit of pass cost (``costs``, else :func:`pass_cost`; 0 where no
    draft pays)."""
    cost = costs.cost if costs is not None else lambda m: pass_cost(m, config)
    lengths: list[int] = []
    tokens, total = float(rows), float(positions)
    for row in odds:
        best, best_gain = 0, 0.0
        best_ratio = tokens / cost(total)
        reach, gain = 1.0, 0.0
        for length, p in enumerate(row, 1):
            reach *= p
            gain += reach
            ratio = (tokens + gain) / cost(total + length)
            if ratio > best_ratio * (1 + 1e-9):
                best, best_gain, best_ratio = length, gain, ratio
        lengths.append(best)
        tokens += best_gain
        total += best
    return lengths


#: How many of a pair's own checks weigh as much as its class's odds.
PAIR_WEIGHT = 1.0


class DraftRecord:
    """The engine's record of its draft tokens, by class (the length of the suffix match
    they followed from, then the after-forced tokens: :class:`NgramDrafter`'s), apart for
    rows under a grammar and free ones: the odds a new request's drafter starts from.

    A class's odds are its kept over its checked tokens, with the config's prior counted
    as ``weight`` tokens; past ``window`` checked tokens a class's counts are halved, so
    the record follows the recent requests (a change of workload).

    Written and read on the engine thread only.
    """

    def __init__(self, config: SpeculationConfig, *, weight: float = 16.0, window: float = 1000.0) -> None:
        if weight <= 0 or window <= 0:
            raise ValueError("need weight > 0 and window > 0")
        self._prior = [*config.prior, config.after_forced_prior]
        self._weight = weight
        self._window = window
        self._tried = {kind: [0.0] * len(self._prior) for kind in (False, True)}
        self._kept = {kind: [0.0] * len(self._prior) for kind in (False, True)}

    def odds(self, cls: int, *, constrained: bool) -> float:
        """The odds that a draft token of class ``cls`` is kept."""
        w = self._weight
        return (self._kept[constrained][cls] + w * self._prior[cls]) / (self._tried[constrained][cls] + w)

    def record(self, cls: int, kept: bool, *, constrained: bool) -> None:
        """A draft token of class ``cls`` was checked, and kept or refused."""
        tried, kept_ = self._tried[constrained], self._kept[constrained]
        tried[cls] += 1
        kept_[cls] += kept
        if tried[cls] > self._window:
            tried[cls] /= 2
            kept_[cls] /= 2


#: The class of a draft token the grammar forces (kept once the token before it is).
FORCED = -1


class NgramDrafter:
    """One request's context (prompt, then every token it emits) indexed by n-grams, and
    its record of how its drafts fared.

    ``propose`` looks up the context's last ``max_ngram`` ... ``min_ngram`` tokens and
    returns what followed their latest earlier occurrence. The index holds every n-gram
    ending before the context's last token, so the suffix never finds itself; keeping it
    costs O(``max_ngram``) a token.
    """

    def __init__(
        self, context: Sequence[int], config: SpeculationConfig, *, shared: DraftRecord | None = None
    ) -> None:
        self.config = config
        self._tokens: list[int] = []
        self._seen: dict[tuple[int, ...], int] = {}
        #: The engine's record (the odds this one's start from) and whether the last
        #: proposal went through a grammar (which of its records it reads and writes).
        self._shared = shared if shared is not None else DraftRecord(config)
        self._constrained = False
        #: Draft tokens checked and kept, by class: the length of the suffix match they
        #: followed from (``0 ... len(prior) - 1``), then the after-forced tokens.
        self._tried = [0] * (len(config.prior) + 1)
        self._kept = [0] * (len(config.prior) + 1)
        self._after_class = len(config.prior)
        #: The last proposal's tokens' classes (FORCED for forced tokens) and pairs (the
        #: token before each, and it).
        self._classes: list[int] = []
        self._pairs: list[tuple[int, int]] = []
        #: Draft tokens checked and kept, by pair: a pair's own record sharpens its class's
        #: odds (``": "`` after a key is always kept, the first digit of a value seldom).
        self._pair_record: dict[tuple[int, int], list[int]] = {}
        #: What the row took after the grammar's last forced run, and the run being recorded.
        self._after_forced: list[int] = []
        self._recording: list[int] | None = None
        self.extend(context)

    def extend(self, tokens: Sequence[int], *, forced: int = 0) -> None:
        """Append emitted tokens to the context (the last ``forced`` of them forced by the
        grammar)."""
        ctx, seen = self._tokens, self._seen
        for token in tokens:
            end = len(ctx)  # n-grams ending at the current last token now have a successor
            for n in range(self.config.min_ngram, min(self.config.max_ngram, end) + 1):
                seen[tuple(ctx[end - n : end])] = end
            ctx.append(token)
        if forced:
            self._recording = []
        elif self._recording is not None:
            self._recording += tokens
            if len(self._recording) >= self.config.after_forced:
                self._after_forced = self._recording[: self.config.after_forced]
                self._recording = None

    def odds(self) -> list[float]:
        """The odds that each token of the last proposal is kept once those before it are."""
        w = self.config.prior_weight
        out = []
        for c, pair in zip(self._classes, self._pairs, strict=True):
            if c == FORCED:
                out.append(1.0)
                continue
            prior = self._shared.odds(c, constrained=self._constrained)
            odds = (self._kept[c] + w * prior) / (self._tried[c] + w)
            record = self._pair_record.get(pair)
            if record is not None:
                odds = (record[1] + PAIR_WEIGHT * odds) / (record[0] + PAIR_WEIGHT)
            out.append(odds)
        return out

    def propose(
        self, limit: int, matcher: GrammarMatcher | None = None, stop_ids: Container[int] = ()
    ) -> list[int]:
        """At most ``min(limit, max_draft)`` tokens that followed the context's suffix the
        last time it occurred (:meth:`odds` then says how likely each is to be kept).

        With ``matcher`` (the row's grammar, at the state after its context) the draft
        goes through the grammar as it grows: it ends at the first token the grammar
        refuses, the tokens the grammar forces after a draft token are the draft's next
        ones (jump-forward, as the row would take them), and after forced tokens the
        lookup starts again from the new suffix where the old match foresaw something
        else; where that finds nothing the grammar allows, the draft goes on with what the
        row took after the last forced run. The matcher is left as it was. A draft never
        holds a token of ``stop_ids``.
        """
        self._classes, self._pairs = [], []
        self._constrained = matcher is not None
        limit = min(limit, self.config.max_draft)
        if limit < 1:
            return []
        ctx = self._tokens
        top = len(self.config.prior)
        draft: list[int] = []
        classes = self._classes
        taken = 0  # tokens the matcher accepted (rolled back at the end)
        source, matched = self._lookup(draft)  # where in ctx the draft reads on, and the match's length
        fallback: list[int] = []
        try:
            while len(draft) < limit:
                if matcher is not None and draft:
                    forced = matcher.jump_forward()[: limit - len(draft)]
                    if forced:
                        if any(t in stop_ids for t in forced):
                            break
                        n = matcher.accept_tokens(forced)
                        taken += n
                        self._pairs += [(-1, t) for t in forced[:n]]
                        draft += forced[:n]
                        classes += [FORCED] * n
                        if n < len(forced):
                            break
                        # The lookup reads on where it foresaw these tokens, else anew.
                        if source is not None and ctx[source : source + n] == forced:
                            source, matched = source + n, matched + n
                        else:
                            source, matched = self._lookup(draft)
                            fallback = list(self._after_forced)
                        continue
                token = ctx[source] if source is not None and source < len(ctx) else -1
                if token >= 0 and token not in stop_ids and (matcher is None or matcher.accept_token(token)):
                    classes.append(min(matched, top) - 1)
                    source, matched = (source or 0) + 1, matched + 1
                elif fallback:
                    token = fallback.pop(0)
                    if token in stop_ids or (matcher is not None and not matcher.accept_token(token)):
                        break
                    classes.append(self._after_class)
                    source, matched = self._lookup([*draft, token])
                    if source is not None:  # the lookup has something again: read on there
                        fallback = []
                else:
                    break
                taken += matcher is not None
                self._pairs.append((draft[-1] if draft else ctx[-1] if ctx else -1, token))
                draft.append(token)
        finally:
            if taken and matcher is not None:
                matcher.rollback(taken)
        return draft

    def _lookup(self, draft: Sequence[int]) -> tuple[int | None, int]:
        """Where in the context what followed the longest indexed suffix of ``context +
        draft`` starts (its latest occurrence), and that suffix's length; ``(None, 0)``
        where none occurred."""
        ctx = self._tokens
        total = len(ctx) + len(draft)
        for n in range(min(self.config.max_ngram, total), self.config.min_ngram - 1, -1):
            if n <= len(draft):
                key = tuple(draft[len(draft) - n :])
            else:
                key = tuple(ctx[len(ctx) - (n - len(draft)) :]) + tuple(draft)
            end = self._seen.get(key)
            if end is not None:
                return end, n
        return None, 0

    def record(self, proposed: int, accepted: int) -> None:
        """How the last proposal's first ``proposed`` tokens fared: the first ``accepted``
        were kept; the one after them (if any) was checked and refused."""
        checked = min(proposed, accepted + 1)
        for j, (c, pair) in enumerate(zip(self._classes[:checked], self._pairs[:checked], strict=True)):
            if c != FORCED:
                self._tried[c] += 1
                self._kept[c] += j < accepted
                self._shared.record(c, j < accepted, constrained=self._constrained)
                record = self._pair_record.setdefault(pair, [0, 0])
                record[0] += 1
                record[1] += j < accepted
