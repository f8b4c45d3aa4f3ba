"""Kernel families shipped with kernsearch: one folder each, a family.toml and its Jinja templates."""
