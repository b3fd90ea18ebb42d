"""Console form bodies. One model per form is both what the form posts (a route takes it as
`Annotated[Model, Form()]`) and what its page shows again when the post is refused, so that
what was typed stays in the fields. Fields default to what a missing field means (mostly "",
so that the service's message says what is missing rather than a 422); what a page shows
at first is an instance of its own (`OFFPEAK_SHOWN`)."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict


class FormBody(BaseModel):
    """A form as posted. A form whose fields have a length limit says so in its own
    `model_config` (`ConfigDict(str_max_length=200)`; longer: 422)."""

    model_config = ConfigDict(frozen=True)

    def stripped(self) -> Self:
        """The same form with the spaces around each text field taken off."""
        return self.model_copy(
            update={k: v.strip() for k, v in self.__dict__.items() if isinstance(v, str)}
        )
