"""The ground floor's log room: what the run that writes a log and the report and store that
read it both need. Today it holds the one range check (`mlhpc.log.plausible`); the MLLOG writer
and reader are to follow it here (docs/architecture.md)."""
