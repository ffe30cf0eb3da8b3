"""Stored performance baselines per GPU (importable as ``pytest_attnkit.baselines``)."""
