"""The command line's wing: what :mod:`imagenet_cog.cli` needs beside its face module.

- :mod:`~imagenet_cog._cli.data`: ``imagenet-cog data``, what a copy holds for each domain
  before a long extraction, and the extract command that follows.
- :mod:`~imagenet_cog._cli.submit`: ``imagenet-cog submit``, a command of imagenet-cog run as a
  SLURM job through submitit, requeued and resumed when preempted, and the jobs' state.
"""
