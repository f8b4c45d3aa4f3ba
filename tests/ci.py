"""In CI a test that needs a system package (.ci/run installs PostgreSQL and Chromium) must run: a missing one
fails there instead of skipping, so a broken install cannot turn the browser or farm tests into silent skips."""

from __future__ import annotations

import os

IN_CI = bool(os.environ.get("CI") or os.environ.get("KERNSEARCH_CI"))
