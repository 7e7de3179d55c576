"""Accelerator tools' output (captures, or the tool run live), parsed into the neutral ``DeviceSample``.

One module per tool; ``detect`` picks the parser from a capture's content; ``events`` turns samples into the
pipeline's events and ``live`` runs a tool each period. The dcgm-exporter source (``gpucost.producers.dcgm``) bills
the neutral samples of ``dcgm_exporter``'s one reading of each scrape, by its own rules (MIG, pods, unclaimed busy
time) rather than ``events``'.
"""
