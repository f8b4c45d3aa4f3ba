"""Exporting: the artifact store's current kernels → an installable package that dispatches by chip and shape,
with the run-time dispatcher it copies (→ export)."""
