"""The base layer: errors, text, checks, files and YAML helpers every other layer uses.

Nothing here imports torch, Optuna or any other part of geosearch.
"""
