"""One run of a benchmark, from its config to its files (docs/architecture.md, "How a run flows").

`mlhpc.run.command.run` is the entry: the run in one straight line, and what ``mlhpc run``
composes around it (the checkpoint to resume chosen, `resume`; the ranks started; the embedded
data made where missing; power sampled around the loop; the summary read back from the log; the
ranks' agreed exit status). `train` holds the run's stages, from its log to its files, each
taking values and returning values around a `Job` built once (`job`), down to the timed loop.
The other modules are its parts, shared with
``mlhpc profile`` (`profile`) and the benchmarks: `assemble` (staging and the parts), `step`
(the training step), `evaluate` (the quality metric over ranks), `mllog` (the records around
the timed run), `checkpoint` (save, restore, the claim on a resumed checkpoint), `outcome` (how a
run ends: signals, a failed attempt set aside, the side files after run_stop, the ranks'
agreement), `result` (a run's files: the results folder checked, the side files written once),
`env` (what a run ran on), `roofline` and `roofline_figure` (``mlhpc profile --roofline``).
"""
