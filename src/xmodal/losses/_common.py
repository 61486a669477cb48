"""Argument checks shared by the loss modules."""

from __future__ import annotations

from xmodal._validate import number, positive_number


def optional_positive(v, name: str) -> float | None:
    """``None`` or a positive finite float."""
    return None if v is None else positive_number(v, name)


def non_negative(v, name: str) -> float:
    """A finite float >= 0 (margins)."""
    return number(v, name, minimum=0.0)


class DirectionalTemperatures:
    """Mixin for losses with a temperature plus optional per-direction overrides
    (text->video and video->text, TS++ sec. 5.6.4)."""

    def _set_temperatures(self, temperature, t2v_temperature, v2t_temperature) -> None:
        self.temperature = positive_number(temperature, "temperature")
        self.t2v_temperature = optional_positive(t2v_temperature, "t2v_temperature")
        self.v2t_temperature = optional_positive(v2t_temperature, "v2t_temperature")

    def _temperatures(self, temperature=None, t2v_temperature=None, v2t_temperature=None) -> dict:
        """The constructed temperatures, each overridden by a forward keyword that is not None."""
        return {
            "temperature": self.temperature if temperature is None else temperature,
            "t2v_temperature": self.t2v_temperature if t2v_temperature is None else t2v_temperature,
            "v2t_temperature": self.v2t_temperature if v2t_temperature is None else v2t_temperature,
        }
