"""A stand-in for NVIDIA's ``cupti`` module that replays recorded activity through the collector's callbacks."""
