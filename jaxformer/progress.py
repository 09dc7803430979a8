"""Progress bars: shown at a terminal, off when stderr is redirected (a log file), unless asked.

Every command takes the same switch: ``--progress_bar=auto|true|false`` (``python -m
jaxformer.cli.evaluate``, ``predict``, ``answer``) and ``--config.progress_bar=true|false`` for
``train.py`` (unset = auto). ``auto`` is tqdm's ``disable=None``: a bar only when its stream,
stderr, is a terminal, so a redirected log gets no carriage-return frames.
"""

from __future__ import annotations

PROGRESS_CHOICES = ("auto", "true", "false")
PROGRESS_HELP = ("progress bars: auto = only when stderr is a terminal (a redirected log gets "
                 "none), true, false")


def bar_disabled(progress: bool | str | None) -> bool | None:
    """tqdm's ``disable`` for the setting ``progress``: True / "true" → shown (False), False /
    "false" → hidden (True), None / "auto" → None (hidden unless the stream is a terminal)."""
    if progress is None or progress == "auto":
        return None
    if isinstance(progress, str):
        if progress not in PROGRESS_CHOICES:
            raise ValueError(f"progress_bar={progress!r} must be one of {PROGRESS_CHOICES}")
        return progress == "false"
    return not progress
