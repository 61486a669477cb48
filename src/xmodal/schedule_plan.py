"""Former home of :mod:`xmodal.training.schedule_plan` (kept importable: ``xmodal.schedule_plan`` *is* that module)."""

import sys

from xmodal.training import schedule_plan as _module

sys.modules[__name__] = _module
