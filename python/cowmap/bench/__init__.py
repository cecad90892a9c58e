"""The cowmap benchmark harness (``python -m cowmap.bench``)."""

import os

# numpy's OpenBLAS threads spin on idle cores; on a 2-core machine that steals
# from the code under measurement. Set before anything imports numpy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
