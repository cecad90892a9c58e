"""Flink-style keyed state on top of the compiled map (DESIGN.md §3)."""
