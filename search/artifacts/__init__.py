"""Artifacts: a study's winner → a gated, versioned, re-checked entry of the artifact store (→ artifact)."""
