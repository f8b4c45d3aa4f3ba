"""kernsearch: find the fastest correct variant of an MLX custom kernel for the chip it runs on."""
__version__ = "0.1.0"
