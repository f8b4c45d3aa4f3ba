"""The family stage: a family folder's spec → its constrained search space → the rendered kernel source
and launch geometry of one config (spec → space → render)."""
