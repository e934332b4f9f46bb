"""Benchmarks: each script prints one JSON object comparing alternatives side by side."""
