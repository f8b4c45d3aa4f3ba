"""What chips and targets exist: the chip registry (``chips.toml``, data) with detection, and the targets
table (Metal, CUDA) every stage reads."""
