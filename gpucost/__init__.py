"""gpucost: the CLI and the wiring that connects sources, operators and sinks."""
