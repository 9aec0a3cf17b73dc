"""What every command that loads a model does first."""

from __future__ import annotations

import os


def quiet_libraries() -> None:
    """No hub access, no progress bars, no library chatter on a command's output."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
