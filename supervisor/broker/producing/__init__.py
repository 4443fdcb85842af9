"""The broker's producer: what any process that sends runs to write jobs (ARCHITECTURE.md,
"The broker's parts"). It never imports the worker side (lint-imports): a web process that
only sends loads none of it."""
