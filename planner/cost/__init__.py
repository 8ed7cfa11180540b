"""Prices, jobs files, the ILPs (the only importer of PuLP) and cost planning."""
