"""Benchmarks of official_ext: `python -m official_ext.benchmark FAMILY`.

`harness` runs a family's section and prints/writes its figures; one module
per family (`yt8m`, `readout`, `assemblenet`) measures them, each timing
through the one interleaved helper in `timing`; peak memory is measured in
child processes through `memory`. This package imports the families; no
family imports it. Importing the package imports nothing else (a memory
child process imports only its family's module and `memory`).
"""
