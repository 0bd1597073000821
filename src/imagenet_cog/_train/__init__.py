"""The training wing: the SGD engine, its fused step, the feed, the memory plan and the searches
that run in lockstep on it. (Where training runs, which the extraction and the analyses ask
too, is :mod:`imagenet_cog._device`; the processes of a torchrun job, which the extraction
shares, are :mod:`imagenet_cog._distributed`.)

Private: the public faces are :class:`~imagenet_cog.LinearProbe`, :func:`~imagenet_cog.run_searches`
and :func:`~imagenet_cog.evaluate`.
"""
