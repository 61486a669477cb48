"""Former home of :mod:`xmodal.training.loop` (kept importable: ``xmodal.train`` *is* that module)."""

import sys

from xmodal.training import loop as _module

sys.modules[__name__] = _module
