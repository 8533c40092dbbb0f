"""Schedules: checking them and computing their times (cron via ``cronsim``, zones via zoneinfo).

Owns the one reading of a TaskSchedule: a cron expression has exactly 5 fields (cronsim
also takes a seconds field: refused here) and is evaluated in an IANA zone, with cronsim's
Debian-cron handling of daylight saving time (a time that does not exist that day runs at
the first minute after the gap; a repeated hour runs once); a one-shot schedule is one
moment. Every time is integer milliseconds since the epoch.
"""

from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from protocol.tasks import CronSchedule, OnceSchedule, TaskSchedule
from sidecar.errors import InvalidParams

__all__ = ["zone", "check_schedule", "next_time", "describe", "MAX_LOOKAHEAD_YEARS"]

MAX_LOOKAHEAD_YEARS = 5
"""A cron expression that matches no time within this many years (``0 0 30 2 *``), or a
one-shot time further ahead, is refused."""
_YEAR_MS = 366 * 86_400_000


def zone(name: str, field: str) -> ZoneInfo:
    """The IANA zone ``name``, or INVALID_PARAMS naming ``field``."""
    if "\x00" in name or name.startswith("/") or ".." in name:
        raise InvalidParams(f"invalid params: {field} {name!r} is not an IANA time zone name - at `$.{field}`")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidParams(
            f"invalid params: {field} {name!r} is not a known IANA time zone name - at `$.{field}`"
        ) from None


def _cron(expression: str, start: datetime) -> CronSim:
    return CronSim(expression, start)


def check_schedule(schedule: TaskSchedule, default_zone: str, now_ms: int, field: str = "schedule") -> None:
    """INVALID_PARAMS naming the field when ``schedule`` cannot run (bad expression or zone,
    a cron time that never comes, a one-shot time before now or past the same lookahead)."""
    if isinstance(schedule, OnceSchedule):
        if schedule.at <= now_ms:
            raise InvalidParams(f"invalid params: {field}.at is in the past - at `$.{field}.at`")
        if schedule.at - now_ms > MAX_LOOKAHEAD_YEARS * _YEAR_MS:
            raise InvalidParams(
                f"invalid params: {field}.at is more than {MAX_LOOKAHEAD_YEARS} years ahead - at `$.{field}.at`"
            )
        return
    fields = schedule.expression.split()
    if len(fields) != 5:
        raise InvalidParams(
            f"invalid params: {field}.expression needs 5 fields (minute hour day-of-month month day-of-week),"
            f" got {len(fields)} - at `$.{field}.expression`"
        )
    tz = zone(schedule.timezone, f"{field}.timezone") if schedule.timezone else zone(default_zone, "timezone")
    start = datetime.fromtimestamp(now_ms / 1000, tz)
    try:
        first = next(_cron(" ".join(fields), start))
    except (CronSimError, StopIteration, ValueError, OverflowError) as exc:
        raise InvalidParams(
            f"invalid params: {field}.expression {schedule.expression!r}: {exc or 'matches no time'}"
            f" - at `$.{field}.expression`"
        ) from None
    if first.year - start.year > MAX_LOOKAHEAD_YEARS:
        raise InvalidParams(
            f"invalid params: {field}.expression {schedule.expression!r} matches no time in the next"
            f" {MAX_LOOKAHEAD_YEARS} years - at `$.{field}.expression`"
        )


def next_time(schedule: TaskSchedule, zone_name: str, after_ms: int) -> int | None:
    """The first time of ``schedule`` strictly after ``after_ms`` (None: a one-shot whose
    moment has passed, or an expression that matches nothing any more)."""
    if isinstance(schedule, OnceSchedule):
        return schedule.at if schedule.at > after_ms else None
    # whole seconds: cronsim drops the fraction, and a time equal to after_ms must not repeat
    start = datetime.fromtimestamp(after_ms // 1000, ZoneInfo(zone_name))
    try:
        found = next(_cron(schedule.expression, start))
    except (CronSimError, StopIteration, ValueError, OverflowError):
        return None
    if found.year - start.year > MAX_LOOKAHEAD_YEARS:
        return None
    return int(found.timestamp() * 1000)


def effective_zone(schedule: TaskSchedule, default_zone: str) -> str:
    if isinstance(schedule, CronSchedule) and schedule.timezone:
        return schedule.timezone
    return default_zone


def describe(schedule: TaskSchedule, zone_name: str) -> str:
    """The schedule in words (cronsim's explanation), or the one-shot moment in ISO 8601."""
    if isinstance(schedule, OnceSchedule):
        try:
            moment = datetime.fromtimestamp(schedule.at / 1000, timezone.utc).astimezone(ZoneInfo(zone_name))
        except (ValueError, OverflowError, OSError):  # stored before the lookahead was checked
            return f"Once at {schedule.at} ms since 1970 (outside the calendar)"
        return "Once at " + moment.isoformat(timespec="minutes")
    try:
        return _cron(schedule.expression, datetime.now(ZoneInfo(zone_name))).explain()
    except (CronSimError, ValueError):
        return schedule.expression
