"""What a reader reads of results: the verdict on comparability written for a reader, the
names of the models, the answer first, and the self-contained HTML report.

The results stage's wing (stage "results"): its modules read :class:`~imagenet_cog.Results`
through their public methods and the stage's flat modules (``_comparability``, ``_tables``,
``_figures``, ``_paired``), and earlier stages; nothing of a later stage.
"""
