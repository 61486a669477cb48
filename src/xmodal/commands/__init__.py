"""Subcommands of the ``xmodal`` CLI (see :mod:`xmodal.cli`)."""
