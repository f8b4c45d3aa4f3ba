"""Evaluation: a rendered variant and a back-end → verified against the float64 reference → timed, in an
isolated worker (→ verify → measure)."""
