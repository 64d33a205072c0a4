"""Workloads run on a real primary."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator

import pymysql

from relay.testing.mariadb import MariaDB


def connect(server: MariaDB) -> pymysql.Connection:
    return pymysql.connect(unix_socket=server.socket_path, user="root", autocommit=True,
                           max_allowed_packet=1 << 30)


def mixed(server: MariaDB, *, rounds: int = 3) -> None:
    """DML of many column types, DDL, updates, deletes, MyISAM, rotations."""
    with contextlib.closing(connect(server)) as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS shop")
        cur.execute("""CREATE TABLE IF NOT EXISTS shop.items (
            id INT PRIMARY KEY AUTO_INCREMENT, name VARCHAR(100), price DECIMAL(10,2),
            qty BIGINT UNSIGNED, ratio DOUBLE, f FLOAT, born DATE, at DATETIME(6),
            ts TIMESTAMP(3) NULL, t TIME(2), y YEAR, flag BIT(5), e ENUM('a','b','c'),
            s SET('x','y','z'), doc JSON, data BLOB, note TEXT, c CHAR(10), tiny TINYINT,
            small SMALLINT, med MEDIUMINT) ENGINE=InnoDB""")
        cur.execute("CREATE TABLE IF NOT EXISTS shop.log (id INT, msg VARCHAR(50)) ENGINE=MyISAM")
        for r in range(rounds):
            for i in range(50):
                cur.execute(
                    "INSERT INTO shop.items (name, price, qty, ratio, f, born, at, ts, t, y, "
                    "flag, e, s, doc, data, note, c, tiny, small, med) VALUES (%s, %s, %s, %s, "
                    "%s, '2024-02-29', NOW(6), NOW(3), '12:34:56.78', 2024, b'10101', 'b', "
                    "'x,z', %s, %s, %s, 'abc', -5, 300, -70000)",
                    (f"item {r}-{i}", i * 1.25, 2**63 + i, i / 3, i / 7,
                     '{"k": [1, 2, {"n": null}]}', bytes(range(256)) * (i % 3), "é" * i))
            cur.execute("INSERT INTO shop.items (name) VALUES (NULL), ('only name')")
            cur.execute("BEGIN")
            cur.execute("UPDATE shop.items SET price = price * 2, note = 'updated' "
                        "WHERE id % 3 = 0")
            cur.execute("DELETE FROM shop.items WHERE id % 7 = 0")
            cur.execute("COMMIT")
            cur.execute("INSERT INTO shop.log VALUES (%s, 'myisam row')", (r,))
            cur.execute(f"CREATE TABLE shop.tmp{r} (a INT PRIMARY KEY)")
            cur.execute(f"ALTER TABLE shop.tmp{r} ADD COLUMN b VARCHAR(10)")
            cur.execute(f"DROP TABLE shop.tmp{r}")
            cur.execute("FLUSH BINARY LOGS")


def large(server: MariaDB) -> None:
    """One transaction over 100 MB and one row event over 16 MiB."""
    with contextlib.closing(connect(server)) as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS big")
        cur.execute("CREATE TABLE IF NOT EXISTS big.t (id INT PRIMARY KEY, v LONGBLOB)")
        cur.execute("BEGIN")
        cur.execute("INSERT INTO big.t SELECT seq, REPEAT('b', 1048576) FROM mysql.seq_1_to_105")
        cur.execute("COMMIT")
        cur.execute("INSERT INTO big.t VALUES (1000, REPEAT('z', 17 * 1048576))")
        cur.execute("UPDATE big.t SET v = REPEAT('y', 17 * 1048576) WHERE id = 1000")


class Background:
    """Small transactions in a thread until stopped: the kill -9 workload."""

    def __init__(self, server: MariaDB, seed: int = 7) -> None:
        self.server = server
        self.rng = random.Random(seed)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.count = 0
        self.error: BaseException | None = None

    def __enter__(self) -> Background:
        with contextlib.closing(connect(self.server)) as conn, conn.cursor() as cur:
            cur.execute("CREATE DATABASE IF NOT EXISTS bg")
            cur.execute("CREATE TABLE IF NOT EXISTS bg.t (id INT PRIMARY KEY AUTO_INCREMENT, "
                        "v VARCHAR(2000), n INT)")
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join(30)

    def _run(self) -> None:
        try:
            with contextlib.closing(connect(self.server)) as conn, conn.cursor() as cur:
                while not self._stop.is_set():
                    k = self.rng.random()
                    if k < 0.6:
                        cur.execute("INSERT INTO bg.t (v, n) VALUES (%s, %s)",
                                    ("v" * self.rng.randint(1, 2000), self.count))
                    elif k < 0.9:
                        cur.execute("BEGIN")
                        for _ in range(self.rng.randint(2, 30)):
                            cur.execute("INSERT INTO bg.t (v, n) VALUES (REPEAT('m', 500), 1)")
                        cur.execute("UPDATE bg.t SET n = n + 1 ORDER BY id DESC LIMIT 20")
                        cur.execute("COMMIT")
                    elif k < 0.98:
                        cur.execute("DELETE FROM bg.t ORDER BY id LIMIT 3")
                    else:
                        cur.execute("CREATE TABLE IF NOT EXISTS bg.d (a INT)")
                        cur.execute("DROP TABLE bg.d")
                    self.count += 1
        except BaseException as exc:  # reported by the test
            self.error = exc


class Writer:
    """A writer thread: `step(cur, rnd)` in autocommit, `pause` seconds apart, until the
    `with` block ends; a failure in the thread is raised there."""

    pause = 0.004
    seed = 11

    def __init__(self, server: MariaDB) -> None:
        self.server = server
        self.stop = threading.Event()
        self.done = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self._hold = threading.Event()
        self._held = threading.Event()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No write while the block runs (the thread waits between two writes)."""
        self._hold.set()
        try:
            if not self._held.wait(30) and self.error is None:
                raise TimeoutError("the writer did not pause")
            yield
        finally:
            self._hold.clear()

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        if self.error is not None:
            raise self.error

    def step(self, cur: pymysql.cursors.Cursor, rnd: random.Random) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        rnd = random.Random(self.seed)
        try:
            with contextlib.closing(connect(self.server)) as conn, conn.cursor() as cur:
                while not self.stop.is_set():
                    while self._hold.is_set() and not self.stop.is_set():
                        self._held.set()
                        time.sleep(0.01)
                    self._held.clear()
                    self.step(cur, rnd)
                    self.done += 1
                    time.sleep(self.pause)
        except BaseException as exc:  # raised by __exit__
            self.error = exc
