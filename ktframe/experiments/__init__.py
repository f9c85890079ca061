"""Experiments of the paper beyond training: sweeps of the hand-built constructions."""
