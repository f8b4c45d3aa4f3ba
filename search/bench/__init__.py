"""Benchmarks of the exported package as its consumers call it (``kernsearch bench``)."""
