"""Private helpers for files another program wrote or that a run hands on: bounded JSON reading
(:mod:`xmodal._files.jsonfile`) and the machine's absolute paths kept out of exports, cards and
trackers (:mod:`xmodal._files.paths`). They import only the standard library and numpy.
"""
