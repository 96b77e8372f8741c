"""``SparkSession.builder.remote("local...")`` serves on the fixed port 15002: two test processes doing it side by
side race for the port (the second fails to bind, or its client reaches the first's server). Importing this module
waits until no other such script of this machine holds the port, and holds it until this process ends."""
import fcntl
import os
import tempfile

_lock = open(os.path.join(tempfile.gettempdir(), f"tfnb-tests-connect-15002-{os.getuid()}.lock"), "w")
fcntl.flock(_lock, fcntl.LOCK_EX)
