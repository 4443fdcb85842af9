"""One worker process: settings, boot and drain, upkeep, guard, schedules, the registry."""
