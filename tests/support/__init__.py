"""Helpers the test modules share: builders of operator inputs, fakes and oracles used by more than one module."""
