"""Accelerator tools' output (captures, or the tool run live), parsed into the neutral ``DeviceSample``.

One module per tool; ``detect`` picks the parser from a capture's content; ``events`` turns samples into the
pipeline's events and ``live`` runs a tool each period. The dcgm-exporter source bills from its own reading of the
scrape (``gpucost.producers.dcgm``) and takes its device faults from this one.
"""
