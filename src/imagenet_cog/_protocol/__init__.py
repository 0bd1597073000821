"""The protocol stage's wing: what :mod:`imagenet_cog.protocol` needs beside its face module.

- :mod:`~imagenet_cog._protocol.checks`: the checks of ``evaluate``'s input and the summary of
  each domain's data its records carry.
"""
