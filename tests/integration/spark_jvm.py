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
with a warning (never an error) by a JVM it does not fit.
"""

from __future__ import annotations

import atexit
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
    """The warm-up job, started once, in the background while the Spark module sets up its
    servers (it takes about a minute, mostly the JVM writing the archive)."""

    def __init__(self) -> None:
        self.base = tempfile.mkdtemp(prefix="relay-spark-cds-")
        self.archive = os.path.join(self.base, "spark.jsa")
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable,
                   PYSPARK_SUBMIT_ARGS=f"--conf spark.ui.enabled=false --driver-java-options "
                                       f"'-XX:ArchiveClassesAtExit={self.archive} {C1_ONLY}' "
                                       "pyspark-shell")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WARM_UP, os.path.join(self.base, "out")], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        atexit.register(self.stop)

    def options(self) -> str:
        try:
            ok = self.proc.wait(300) == 0
        except subprocess.TimeoutExpired:
            self.stop()
            ok = False
        return f"-XX:SharedArchiveFile={self.archive} {C1_ONLY}" \
            if ok and os.path.exists(self.archive) else C1_ONLY

    def stop(self) -> None:
        if self.proc.poll() is None:  # its JVM is in its process group
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
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
