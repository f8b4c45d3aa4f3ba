"""The run-time dispatcher copied into every package ``kernsearch export`` builds (mlx only; no kernsearch)."""
