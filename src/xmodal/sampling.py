"""Former home of :mod:`xmodal.training.sampling` (kept importable: ``xmodal.sampling`` *is* that module)."""

import sys

from xmodal.training import sampling as _module

sys.modules[__name__] = _module
