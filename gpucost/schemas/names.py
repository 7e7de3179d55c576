"""The pipeline's own party names, and what a name reads as on a report.

A tenant may not take a name that reads as one of the pipeline's own parties (``idle``, ``unattributed``,
``unallocated``) in any script or case: a report would show two of them. ``skeleton`` is how a name reads.
"""

from __future__ import annotations

import unicodedata

__all__ = ["RESERVED_TEAMS", "RESERVED_SKELETONS", "skeleton"]

#: the pipeline's own parties: ``idle`` (usage basis), ``unattributed`` (no binding), ``unallocated`` (allocation basis)
RESERVED_TEAMS = frozenset({"idle", "unattributed", "unallocated"})

#: letters from other scripts that render like the Latin letters of the reserved names (Unicode's
#: confusables for a, b, c, d, e, i, l, n, o, r, t, u), which NFKC and case folding leave apart
_LOOKALIKES = str.maketrans(
    {
        "ı": "i",
        "і": "i",
        "ɩ": "i",
        "ι": "i",
        "ӏ": "i",
        "ⅼ": "i",
        "а": "a",
        "ɑ": "a",
        "α": "a",
        "е": "e",
        "ε": "e",
        "ԁ": "d",
        "ɗ": "d",
        "ո": "n",
        "η": "n",
        "г": "r",
        "т": "t",
        "τ": "t",
        "υ": "u",
        "ս": "u",
        "Ь": "b",
        "ь": "b",
        "о": "o",
        "ο": "o",
        "с": "c",
        "ϲ": "c",
        "ᴜ": "u",
        "0": "o",
        # the vertical strokes, which no font keeps apart from each other: one letter for all (``idle`` reads
        # ``idie``, and so does ``IdIe``)
        "l": "i",
        "1": "i",
        "|": "i",
        "ǀ": "i",
        "ꓲ": "i",
        "ⵏ": "i",
    }
)


def skeleton(name: str) -> str:
    """What a name reads as: NFKC, case-folded, without the characters that render as nothing or as
    space (format, control and separator characters, combining marks) and with look-alike letters of
    other scripts mapped to Latin, and every vertical stroke (i, l, 1, |…) to one letter. Two names with one skeleton
    look the same on a report."""
    folded = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", name).casefold())
    kept = "".join(c for c in folded if unicodedata.category(c)[0] not in "CZM")
    return kept.translate(_LOOKALIKES)


RESERVED_SKELETONS = frozenset(skeleton(team) for team in RESERVED_TEAMS)
