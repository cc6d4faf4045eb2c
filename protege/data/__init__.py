"""Datasets: reading, validation (Great Expectations) and curation."""
