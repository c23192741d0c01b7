"""The MLLOG log, written and read: a result is made here, where the run (which writes it) and
report and store (which read it) meet; a ground-layer package (docs/architecture.md, "The layers").

- `writer`: the MLLOG writer a run uses (`ComplianceLog`, ``result_N.txt`` claimed with its set
  of files, the HPC keys mlperf_logging has no constant for);
- `parse`: the reader report and store use (``:::MLLOG`` lines -> events, malformed lines listed
  with file and line, never raised; capped, streamed reads through `mlhpc.data.inputs`);
- `summary`: one log -> `RunSummary` (time to train, staging, init, epochs, evaluation); the run
  reads its own summary back from its log through it;
- `facts`: `RunSummary` and its parts, frozen records of what one log says;
- `plausible`: the range check of logged values, shared by the writer's callers and readers;
- `mlperf_adapter`: every call into mlperf_logging's internals (rule and RCP files, checkers).

Nothing here imports the run, the data layer beyond its file access (`files`, `inputs`, `claims`,
`statefiles`), power, report or store.
"""
