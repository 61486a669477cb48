"""Former home of :mod:`xmodal.training.parts` (kept importable: ``xmodal.trainparts`` *is* that module)."""

import sys

from xmodal.training import parts as _module

sys.modules[__name__] = _module
