"""Captures of non-NVIDIA accelerator tools, parsed into the neutral ``DeviceSample``.

One module per tool; ``detect`` picks the parser from a capture's content. Replay only: the
billing pipeline does not read these yet.
"""
