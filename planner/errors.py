"""Errors a user can cause. The CLI turns each into one line on stderr and exit status 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """Bad input: the message names the input and the way out."""


def unknown_name(kind: str, name: str, known: Iterable[str], hint: str) -> UserError:
    """An error for an unknown catalog name, listing the closest known names.

    kind: 'model', 'GPU', 'topology'; hint: the command that lists them all.
    """
    known = sorted(set(known))
    close = difflib.get_close_matches(name.lower(), known, n=4, cutoff=0.4)
    if not close:
        close = [k for k in known if name.lower() in k or k in name.lower()][:4]
    did = f"; did you mean {', '.join(close)}?" if close else ""
    return UserError(f"unknown {kind} {name!r}{did} ({hint} lists them all)")


# The values are those click hands over (None when not given). Each rule is one check, as
# layouts.reject_reason's are, but on the options, so that the message names the flags.
