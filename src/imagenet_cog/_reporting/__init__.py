"""What a reader reads of results: the verdict on comparability written for a reader, the
names of the models and the runs loaded under them, the answer first, and the self-contained
HTML report.

The results stage's wing (stage "results"): its modules read :class:`~imagenet_cog.Results`
through its public methods, the stage's flat modules (``_comparability``, ``_tables``,
``_figures``, ``_paired``), the table of analyses (``_analysis/table.py``, the analysis wing's
face, which sits with this stage) and earlier stages; nothing of a later stage.
"""
