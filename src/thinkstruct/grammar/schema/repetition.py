"""How far counted repetitions unroll a regex or a grammar: :func:`unrolled_size`.

llguidance builds ``a{1000000}`` atom by atom: about 1 µs per unrolled atom on 2 cores
(``a{100000}`` 0.25 s, ``a{1000000}`` 1 s, ``(a{1000}){1000}`` 2 s, then its lexer limit
refuses it), so a ten-character pattern can hold an in-process thread for seconds. The
estimate here sends such patterns to a worker that can be killed. It reads the text
loosely (any ``{n}``/``{n,m}`` after an atom or a group multiplies it; alternatives and
sequences add up), so it errs on the large side and never raises.
"""

from __future__ import annotations

import re

#: Estimates are capped here.
CAP = 1 << 40

_COUNT = re.compile(r"\{(\d{1,12})(?:,(\d{0,12}))?\}")


def unrolled_size(text: str) -> int:
    """An upper estimate of the atoms ``text`` (a regex, or an EBNF grammar) unrolls to."""
    # One running total per open group; ``last`` is the size of the atom or group just
    # read, which a following count multiplies.
    totals = [0]
    opened: list[int] = []
    last = 0
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            # An escape is one atom, its braces included (\x{41}, \p{L}, \u{1F600}).
            j = i + 2
            braced = i + 1 < n and text[i + 1] in "xupPN"
            if braced and j < n and text[j] == "{" and (end := text.find("}", j)) >= 0:
                j = end + 1
            last = 1
            totals[-1] += 1
            i = j
            continue
        if ch == "[" or ch == '"':
            # A class is one atom; a quoted EBNF literal one atom per character.
            close = "]" if ch == "[" else '"'
            j = i + 1
            while j < n and text[j] != close:
                j += 2 if text[j] == "\\" else 1
            last = 1 if ch == "[" else max(j - i - 1, 1)
            totals[-1] += last
            i = j + 1
            continue
        if ch == "{":
            match = _COUNT.match(text, i)
            if match:
                times = max(int(match.group(1)), int(match.group(2) or 0))
                grown = min(last * times, CAP)
                totals[-1] = min(totals[-1] - last + grown, CAP)
                last = grown
                i = match.end()
                continue
        if ch == "(":
            opened.append(i)
            totals.append(0)
            last = 0
        elif ch == ")" and opened:
            opened.pop()
            last = totals.pop()
            totals[-1] = min(totals[-1] + last, CAP)
        else:
            last = 1
            totals[-1] = min(totals[-1] + 1, CAP)
        i += 1
    while len(totals) > 1:  # unclosed groups: count them all the same
        inner = totals.pop()
        totals[-1] = min(totals[-1] + inner, CAP)
    return max(totals[0], 1)
