"""The ground floor's log room: a result is made here, and both sides of the house meet here
(docs/architecture.md, "The floors").

- `writer`: the MLLOG writer a run uses (`ComplianceLog`, ``result_N.txt`` claimed with its set
  of files, the HPC keys mlperf_logging has no constant for);
- `parse`: the reader report and store use (``:::MLLOG`` lines -> events, malformed lines listed
  with file and line, never raised; capped, streamed reads through the project's one reader);
- `summary`: one log -> `RunSummary` (time to train, staging, init, epochs, evaluation);
  the run reads its own summary back from its log through it;
- `plausible`: the one range check of logged values, shared by the writer's callers and readers;
- `mlperf_adapter`: the one door to mlperf_logging's internals (rule and RCP files, checkers).

Nothing here imports the run, the data layer's upper rooms, power, report or store.
"""
