"""Studies: the search over a family's space (Optuna) that evaluates variants and keeps their records, the
objectives it optimises, its storage, history and reports (→ study)."""
