"""Text Postgres can store: no NUL character, no half of a UTF-16 surrogate pair.

Postgres `text` and `jsonb` refuse both, so a frame, a result or an error message that
holds one would fail every write it is part of (a relay's segment batch of every run, an
executor's heartbeat batch). A command's input holding one is refused at submit (see
`runwire.runtime.commands.parse`); what a run produces (a model's output, a tool's result,
a runner's own text) is not refused, which would lose the run's whole reply for one
stray character, but has each such character replaced with U+FFFD, the replacement
character, as a decoder does with a byte it cannot read: once, where the attempt emits
it, so that a follower, a re-join and the run's result read the same text.
"""

import re
from typing import Any

# What Postgres cannot store in text or jsonb: NUL, and UTF-16 halves without a pair.
UNSTORABLE_TEXT = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT = "\ufffd"
# How a NUL character is written in JSON text (the only unstorable character a JSON
# parser of ours lets through: a lone surrogate's escape is refused as invalid JSON).
NUL_ESCAPE = b"\\u0000"


def storable_text(text: str) -> str:
    """`text` with each character Postgres cannot store replaced by U+FFFD."""
    return UNSTORABLE_TEXT.sub(REPLACEMENT, text) if UNSTORABLE_TEXT.search(text) else text


def storable(value: Any) -> Any:
    """`value` (JSON-like: dicts, lists, tuples, strings, anything else kept as it is)
    with every string, keys included, made storable; `value` itself when nothing needed
    a change, so the usual case copies nothing."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        changed = False
        items = []
        for key, item in value.items():
            new_key = storable_text(key) if isinstance(key, str) else key
            new_item = storable(item)
            changed = changed or new_key is not key or new_item is not item
            items.append((new_key, new_item))
        return dict(items) if changed else value
    if isinstance(value, list | tuple):
        new = [storable(item) for item in value]
        if all(a is b for a, b in zip(new, value, strict=True)):
            return value
        return new if isinstance(value, list) else tuple(new)
    return value
