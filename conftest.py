"""pytest set-up for every test file (kept to what no test module can do for itself)."""

import sys

# The session may export PYTHONDONTWRITEBYTECODE=1. Then no pytest process keeps a cache of its
# rewritten test modules or of hypothesis (pytest rewrites every package of a pytest plugin), and
# each worker rewrites and compiles them again: about 5 s of CPU per worker per run. A cache is
# written only for what this process imports; child processes keep their own environment, and
# they read the cached regression.py module (compare_runs.py imports it) instead of compiling it.
sys.dont_write_bytecode = False
