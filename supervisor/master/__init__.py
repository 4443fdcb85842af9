"""The master (arbiter) process: forks, watches and replaces worker processes."""
