"""The two consoles every command prints through (standard output and standard error).

A module of its own so that the CLI and its sub-apps (``kernsearch flows``) share them without importing
each other.
"""

from __future__ import annotations

from rich.console import Console

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)
