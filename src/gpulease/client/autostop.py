"""Automatic stop of an instance (idle, max runtime, after a run) and start/stop schedules."""

from __future__ import annotations

from gpulease.client.base import InstanceRef, Resource, path_part
from gpulease.schemas.autostop import AutostopPublic, AutostopUpdate, ScheduleCreate, SchedulePublic


class AutostopAPI(Resource):
    """`client.autostop`: when an instance stops or starts by itself."""

    def get(self, ref: InstanceRef) -> AutostopPublic:
        return self._api.one(AutostopPublic, "GET", f"/instances/{path_part(ref)}/autostop")

    def set(self, ref: InstanceRef, body: AutostopUpdate) -> AutostopPublic:
        """Replace the instance's automatic stop; a field left out turns that part off."""
        path = f"/instances/{path_part(ref)}/autostop"
        return self._api.one(AutostopPublic, "PUT", path, body=body)

    def add_schedule(self, ref: InstanceRef, body: ScheduleCreate) -> SchedulePublic:
        """Start or stop the instance at the times a cron expression names ("0 9 * * 1-5"),
        in your time zone (client.auth.set_timezone) unless body.timezone is given."""
        path = f"/instances/{path_part(ref)}/schedules"
        return self._api.one(SchedulePublic, "POST", path, body=body)

    def schedules(self, ref: InstanceRef) -> list[SchedulePublic]:
        return self._api.many(SchedulePublic, f"/instances/{path_part(ref)}/schedules")

    def remove_schedule(self, ref: InstanceRef, schedule_id: int) -> None:
        self._api.send("DELETE", f"/instances/{path_part(ref)}/schedules/{int(schedule_id)}")
