"""The one base of every error edgeqa raises for its users to read.

An ``EdgeQAError`` is a condition the user can fix or must know about (a bad setting, a missing
model, a refused release): its message is the whole story, and the ``edgeqa`` command prints it on
one line and exits with status 2. Anything else that escapes is a bug or an unexpected failure of a
library: the command prints its full traceback and exits with status 1.

Subclasses also derive from the built-in type that fits (``ValueError``, ``FileNotFoundError``,
``RuntimeError``) so that callers written against those keep working.
"""

from __future__ import annotations


class EdgeQAError(Exception):
    """A user-facing error: its message says what went wrong and what to do about it."""
