"""edgeqa: LLM answers that feel instant."""

from __future__ import annotations

import origin  # noqa: F401  (first: it sets the OpenMP threads' spin before torch loads)

__version__ = "0.1.0"
