"""AIPerf's benchmark: an AutoML search on an Optuna study whose trials are ordinary ``mlhpc run``
s, scored in FLOPS and regulated score at time marks (`mlhpc.report.automl`; docs/automl.md)."""
