"""Scheduled agent tasks: cron and one-shot jobs that send a prompt through the chat
pipeline (or run the memory upkeep), their runs, and the scheduler.

    schedule.py   checking schedules and computing their times (cronsim, zoneinfo)
    clock.py      the scheduler's clock: the wall clock, or the test clock
    runner.py     TaskRunner: one run, from queued to its final status
    service.py    TaskService: task:* and the scheduler loop
"""
