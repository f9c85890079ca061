"""Compiled CPU kernels (numba) for the hot spots of hard attention and Lloyd's algorithm."""
