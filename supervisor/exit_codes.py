"""Exit codes of every `supervisor` command and process, defined once.

They follow sysexits where one fits, so systemd's `RestartPreventExitStatus=`
and shell scripts can tell a bad config from a database outage.
"""

OK = 0
PROBLEM = 1  # something is wrong: a check failed, a job was not found, the master refused
USAGE = 2  # bad usage or input (including an invalid config file)
BAD_ACTORS = 3  # actor modules cannot be imported, or misplace a middleware: restarting will not help
DATABASE = 4  # the database is unreachable or its schema cannot be prepared
CRASH = 70  # EX_SOFTWARE: an unexpected exception escaped a worker process
