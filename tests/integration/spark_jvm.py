"""JVM options for every Spark JVM the tests start (the module's session, the example
jobs' drivers, a standalone master, its workers and their executors): Spark's classes
from a class-data-sharing archive made once per run, and the client compiler only.

Spark's JVMs spend their start loading and verifying some 20,000 classes, then compile
the first query's code. On the 2-core CI machine a driver took 11.5 s to a SparkSession
and 8.5 s more for a first small aggregation; with the archive 6.2 s and 5.0 s, and
with C1 only as well 4.5 s and 3.5 s. The tests start about fifteen JVMs and their data
is small, so C2's faster code never pays for its compile time here.

The archive is a JDK 17 dynamic one (`-XX:ArchiveClassesAtExit`): written by a short
warm-up job as its JVM exits, valid only for the same JDK and classpath, and ignored
with a warning (never an error) by a JVM it does not fit. It is made once per test run,
not per pytest-xdist worker: the first worker to need it makes it under a lock, the
others wait on that lock (a worker made its own in about a minute before, while its
Spark module waited), and the last process of the run to let go of it removes it.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile

# What the warm-up runs: a batch and a streaming query through Parquet, so the archive
# holds the classes those paths load; anything else loads from the jars as usual.
_WARM_UP = """
import sys
from pyspark.sql import SparkSession
out = sys.argv[1]
s = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
     .config("spark.sql.shuffle.partitions", "2").getOrCreate())
df = s.range(1000).selectExpr("id", "id % 7 AS k", "CAST(id AS STRING) AS v")
df.groupBy("k").count().write.mode("overwrite").parquet(out + "/batch")
assert s.read.parquet(out + "/batch").count() == 7
q = (s.readStream.schema("k BIGINT, count BIGINT").parquet(out + "/batch")
     .writeStream.format("parquet").option("path", out + "/stream")
     .option("checkpointLocation", out + "/ck").trigger(availableNow=True).start())
q.awaitTermination(120)
assert s.read.parquet(out + "/stream").count() == 7
jvm = s.sparkContext._gateway.proc  # it writes the archive as it exits: wait for that
s.stop()
jvm.stdin.close()  # the gateway's JVM exits at the end of its stdin
jvm.wait(240)
"""

C1_ONLY = "-XX:TieredStopAtLevel=1"


class _WarmUp:
    """The warm-up job, started once per test run in the background while the Spark
    module sets up its servers (it takes about a minute, mostly the JVM writing the
    archive), by whichever worker process asks first."""

    def __init__(self) -> None:
        # Every pytest-xdist worker of a run has the run's id; a run without xdist its pid.
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
        self.base = os.path.join(tempfile.gettempdir(), f"relay-spark-cds-{run}")
        os.makedirs(self.base, exist_ok=True)
        self.archive = os.path.join(self.base, "spark.jsa")
        self.made = os.path.join(self.base, "made")   # written once the job succeeded
        # Held shared for as long as this process may start JVMs on the archive.
        self.users = os.open(os.path.join(self.base, "users.lock"), os.O_CREAT | os.O_RDWR)
        fcntl.flock(self.users, fcntl.LOCK_SH)
        # Held exclusive by the worker making the archive, until its job has ended.
        self.making = os.open(os.path.join(self.base, "making.lock"), os.O_CREAT | os.O_RDWR)
        self.proc: subprocess.Popen[bytes] | None = None
        atexit.register(self.stop)
        try:
            fcntl.flock(self.making, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another worker is making it: options() waits for that
        if os.path.exists(self.made):
            fcntl.flock(self.making, fcntl.LOCK_UN)
            return
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable,
                   PYSPARK_SUBMIT_ARGS=f"--conf spark.ui.enabled=false --driver-java-options "
                                       f"'-XX:ArchiveClassesAtExit={self.archive} {C1_ONLY}' "
                                       "pyspark-shell")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WARM_UP, os.path.join(self.base, "out")], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def options(self) -> str:
        if self.proc is not None:
            try:
                if self.proc.wait(300) == 0 and os.path.exists(self.archive):
                    with open(self.made, "w"):
                        pass
            except subprocess.TimeoutExpired:
                self._kill()
            fcntl.flock(self.making, fcntl.LOCK_UN)
        else:
            fcntl.flock(self.making, fcntl.LOCK_SH)   # another worker's job has ended
            fcntl.flock(self.making, fcntl.LOCK_UN)
        return f"-XX:SharedArchiveFile={self.archive} {C1_ONLY}" \
            if os.path.exists(self.made) else C1_ONLY

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:  # its JVM is in its group
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """At exit: the last process of the run that used the archive removes it."""
        self._kill()
        try:
            fcntl.flock(self.users, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another worker may still start JVMs on it
        shutil.rmtree(self.base, ignore_errors=True)


@functools.cache
def warm_up() -> _WarmUp:
    """Start making the archive (once)."""
    return _WarmUp()


@functools.cache
def java_options() -> str:
    """The options, as one string for --driver-java-options, extraJavaOptions and
    SPARK_DAEMON_JAVA_OPTS. Without an archive (the warm-up failed) only C1_ONLY."""
    return warm_up().options()
