"""The benchmarks (bench/README.md): scripts run by path, ``python bench/<script>.py``,
from any working directory (each puts its checkout first on ``sys.path``), and the
modules they import as ``bench.<module>``. A regular package, so a second checkout on
``PYTHONPATH`` (pressure.py against old code) never merges its modules into this one's."""
