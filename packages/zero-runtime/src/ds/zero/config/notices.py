"""The warning a config load gives for DeepSpeed keys ds accepts without acting on them."""

from __future__ import annotations


class UnimplementedConfigWarning(UserWarning):
    """A config sets DeepSpeed keys that ds accepts but does not act on (yet), or keys that
    DeepSpeed itself ignores (unknown keys in sections it reads key by key)."""
