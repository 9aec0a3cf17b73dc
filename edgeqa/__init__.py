"""edgeqa: LLM answers that feel instant."""

from __future__ import annotations

__version__ = "0.1.0"
