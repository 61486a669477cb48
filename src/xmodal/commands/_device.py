"""``--device`` of ``xmodal query`` and ``xmodal serve``: where the ``hf:`` / ``open_clip:`` encoder of the
queries runs (as ``xmodal encode --device`` places it), checked before anything loads."""

from __future__ import annotations


def query_device(device: str | None) -> str | None:
    """``--device`` of ``query`` / ``serve``: None for ``auto`` (CUDA when present, else CPU), else the named
    device, checked (a bad name or an absent GPU: ValueError naming ``--device``)."""
    if device in (None, "auto"):
        return None
    from xmodal.features.encoders import resolve_device

    try:
        return resolve_device(device)
    except ValueError as exc:
        raise ValueError(f"--device: {str(exc).removeprefix('device: ')}") from None


def check_placed(device: str | None, specs: list) -> None:
    """A named ``--device`` places ``hf:`` / ``open_clip:`` encoders only: refused when none of ``specs`` is one."""
    from xmodal.features.identity import shown_spec
    from xmodal.retrieval.search import placed

    if device is not None and not any(placed(s, device) for s in specs):
        shown = ", ".join(shown_spec(s) for s in specs if s) or "no encoder"
        raise ValueError(f"--device: places hf:DIR and open_clip:DIR encoders only; this index's query encoder is "
                         f"{shown} (built-in and registered encoders run as they are built)")
