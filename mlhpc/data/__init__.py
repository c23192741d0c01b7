"""Everything that touches a dataset, one job per file (docs/architecture.md, "The data layer"):

- `files`: the project's atomic writer and temporary-name rule, checksums, locks, folders
  opened without following links (none written through), ownership and overlap checks;
- `inputs`: the project's input reader: no link out of a tree, regular files only, sizes capped;
- `statefiles`: mlhpc's own lock files and journals, opened never waiting on a FIFO, and the
  record of each file a writer puts in place in a claimed folder;
- `manifest`: the manifest schema (versioned) and its parser; complete-or-absent;
- `formats`: the `DataTools` protocol a workload implements for its formats, and detection;
- `pool`: the parallel driver (threads or processes);
- `convert`: ``mlhpc data convert | prepare``; `check`: ``mlhpc data check``;
- `embedded`: embedded (synthetic) datasets, made once, atomically;
- `loader`, `sampler`: batching, on-device decoding, per-node and per-rank sharding;
- `stage`: staging to node-local storage (plan, destination safety, copy and convert strategies,
  the per-node collective).

The harness names no workload and no format here: formats come from the workloads.
"""
