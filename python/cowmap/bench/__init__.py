"""The cowmap benchmark harness (``python -m cowmap.bench``)."""
