"""Parallel layouts: what a layout is, which are valid, and the layouts as arrays."""
