"""Benchmarks of official_ext, one module per family (`harness` drives them).

Importing the package imports nothing else: a memory child process imports
only its family's module and `memory`."""
