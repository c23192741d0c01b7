"""mlhpc: an MLPerf HPC-style benchmark suite.

Trains scientific models (CosmoFlow, DeepCAM, OpenCatalyst: the registered workloads) to their quality target and reports the time to
train split into staging, convergence and compute, with logs that MLCommons' compliance checker
accepts.
"""

__version__ = "0.1.0"
