"""Pure incremental operators: events and settings in, records out; no I/O, no transport, no wall clock."""
