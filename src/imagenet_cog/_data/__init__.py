"""The data wing: reading a copy of ImageNet, whatever its layout, and decoding its images.

After timm's ``data/readers``, one reader per layout behind one factory:

- ``sources``: the image sources (a file, a tar member, a Parquet image, a dataset item, a
  PIL image), the one switch over their kinds, reading their bytes, the image size limit,
  and the read order of a store shard;
- ``tar``: the one tar reader, for tars per wnid and webdataset shards alike;
- ``folders``, ``shards``, ``parquet``: the readers of a folder or tar per wnid copy (and
  ImageNet-1K's ``val/``), of webdataset shards, and of Parquet files;
- ``listing``: the factory, one function that picks a root's layout and lists it;
- ``copies``: layout detection, the listing cache, and each published copy's facts;
- ``labels``: the ImageNet-1K validation labels;
- ``pillow_decode``, ``tensor_decode`` and ``pillow_resize``: decoding with Pillow, decoding
  JPEGs in batches with ``torchvision.io``, and Pillow's resize reproduced in torch;
- ``file_split``: DataLoader workers that split data files, not batches.

Private: the public faces are :func:`~imagenet_cog.make_split` and the extraction.
``datasets`` keeps the paper's split policy and the torch ``Dataset``. The tests that guard
the wing are ``tests/test_data_*.py``.
"""
