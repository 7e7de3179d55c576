"""Pure incremental operators: no I/O, no Faust import, no wall clock."""
