"""Running a command's shards on many processes or machines: :mod:`~xmodal.execute.cluster` (a Dask
cluster: ``local:N`` or a scheduler address, retries, one progress line) and the tasks it runs,
:mod:`~xmodal.execute.videos` (``xmodal encode videos|frames --cluster``), :mod:`~xmodal.execute.rows`
(``xmodal encode text|images --cluster``) and :mod:`~xmodal.execute.index` (index shards).

May import: the standard library, ``xmodal._validate``, ``xmodal.progress``, ``xmodal.runs`` and the layers
whose work it shards (``xmodal.features``, ``xmodal.retrieval``); ``distributed`` lazily (extra
``[cluster]``). Nothing below it imports it; the CLI calls it.
"""
