"""Experiments on positional encodings: length extrapolation (``pe``) and word order (``order``)."""
