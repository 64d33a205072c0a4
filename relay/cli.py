"""`relay` command line: run, check-config, inspect-log. No logic of its own."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any

from relay.buildinfo import commit, version_line
from relay.errors import ConfigError, CorruptLog, FatalUpstreamError, RelayError
from relay.tap.options import DEFAULTS, MIRROR_RESTARTS

if TYPE_CHECKING:
    from relay.status_view import AdminAccess

log = logging.getLogger("relay")


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()),
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")


def cmd_run(args: argparse.Namespace) -> int:
    # Start-up makes tens of thousands of objects that live as long as the process (the
    # modules, their classes and functions): collecting them is wasted work (about 5% of
    # the start-up). App.run freezes them once it serves, then turns collection back on.
    gc.disable()
    from msgspec.structs import replace

    from relay.app import run_app
    from relay.config import check_security, load_config

    config = load_config(args.config)
    if args.data_dir:
        config = replace(config, relay=replace(config.relay, data_dir=args.data_dir))
    _setup_logging(config.relay.log_level)
    commit()   # the commit of the code this process runs (git, before the loop: it blocks)
    # The secure defaults, before anything starts (the sandbox's primary included): an
    # exposed listener or an empty password refuses the start (ConfigError, exit 2); what
    # allow_insecure / allow_empty_password accept is logged as a WARNING.
    for warning in check_security(config):
        log.warning("%s", warning)
    fault = os.environ.get("RELAY_FAULT")
    if fault:
        log.warning("RELAY_FAULT=%r is set: relay log writes or fsyncs WILL FAIL on purpose "
                    "(fault injection for drills); unset it for a real relay", fault)
    sandbox = None
    if args.sandbox or not config.upstream.sources:
        from relay.sandbox import connection_lines, start_sandbox

        sandbox, config = start_sandbox(config, workload=not args.no_workload)
        print(connection_lines(config), flush=True)
    try:
        run_app(config, args.config)
    finally:
        if sandbox is not None:
            sandbox.stop()
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    from relay.app import check_config
    from relay.config import load_config

    config = load_config(args.config)
    warnings = check_config(config)
    for warning in warnings:
        print(f"relay: warning: {warning}", file=sys.stderr)
    print(f"{args.config}: OK" + (f" ({len(warnings)} warning{'s' * (len(warnings) > 1)})"
                                  if warnings else ""))
    print(f"  upstream sources: {len(config.upstream.sources) or 'none (sandbox primary)'}")
    print(f"  data_dir: {os.path.abspath(config.relay.data_dir)}")
    print(f"  sync: {config.relaylog.sync}, segment_size: {config.relaylog.segment_size} bytes")
    return 0


def cmd_inspect_log(args: argparse.Namespace) -> int:
    from relay.binlog.constants import type_name
    from relay.relaylog.naming import read_index
    from relay.relaylog.recovery import event_type_counts, scan_segment
    from relay.relaylog.segfile import stored_path

    names = read_index(args.data_dir, args.basename)
    if not names:
        print(f"no relay log in {args.data_dir} (looked for {args.basename}.index)")
        return 1
    bad = 0
    for name in names:
        path = os.path.join(args.data_dir, name)
        scan = scan_segment(path)
        status = "ok" if scan.error is None else f"ERROR: {scan.error}"
        bad += scan.error is not None
        stored = stored_path(path)
        print(f"{name}: {os.path.getsize(stored)} bytes"
              f"{' (compressed)' if stored != path else ''}, committed to {scan.committed}, "
              f"{len(scan.entries)} transactions, {'sealed' if scan.sealed else 'open'}, "
              f"{status}")
        if args.events:
            counts = Counter({type_name(t): n for t, n in
                              event_type_counts(path, scan.committed).items()})
            print("   " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    last = os.path.join(args.data_dir, names[-1])
    print(f"GTID state: {scan_segment(last).state or '(empty)'}")
    return 1 if bad else 0


def cmd_changes(args: argparse.Namespace) -> int:
    from relay.binlog.gtid import Gtid, GtidState
    from relay.binlog.tablemap import TypeHints
    from relay.relaylog.series import BinlogSeries
    from relay.sources import SourceError, open_source
    from relay.sources.filters import GtidFilter, TableFilter
    from relay.sources.lines import LineWriter, file_lines, use_kernel

    logging.basicConfig(level=logging.WARNING, format="relay: %(message)s")
    try:
        hints = TypeHints.parse(args.type or [])
        gtids = GtidFilter(args.gtid)
    except ValueError as exc:
        print(f"relay: {exc}", file=sys.stderr)
        return 2
    tables = TableFilter.parse(args.table or [])
    try:
        if args.types_from:
            from_live = open_source(args.types_from)
            for key, hint in from_live.hints.items():
                hints.add(*key, hint)
        source = open_source(args.source, follow=args.follow, hints=hints)
    except SourceError as exc:
        print(f"relay: {exc}", file=sys.stderr)
        return 2
    # JSON lines (relay/binlog/changelines.py), by the line kernel over files where it can
    # (relay/sources/lines.py), written per transaction or MiB
    writer = LineWriter(sys.stdout.buffer, tables, queries=args.queries,
                        flush_each=args.follow)
    seen = GtidState()
    try:
        if use_kernel(source.reader, bool(gtids)):
            assert isinstance(source.reader, BinlogSeries)
            file_lines(source.reader, source.hints, writer)
        else:
            for tx in source.transactions():
                if tx.gtid is not None and "-" in tx.gtid and ":" not in tx.gtid:
                    seen.update(Gtid.parse(tx.gtid))
                if not gtids(tx.gtid):
                    if gtids.past_end(seen):
                        break
                    continue
                writer.transaction(tx)
                if gtids.past_end(seen):
                    break
        writer.out.flush()
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (| head): not an error
        return 0
    except SourceError as exc:
        print(f"relay: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_mirror(args: argparse.Namespace) -> int:
    try:  # the [mirror] extra: Spark, Arrow and delta-rs
        import deltalake  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        print(f"relay: relay mirror needs {exc.name}: pip install '.[mirror]' in a checkout "
              "of relay", file=sys.stderr)
        return 2
    from relay.tap.mirror import MirrorJob, MirrorSettings, Trigger

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("relay").setLevel(logging.INFO)   # py4j's own INFO lines stay out
    keys: dict[str, tuple[str, ...]] = {}
    for item in args.keys or []:
        table, eq, cols = item.partition("=")
        if not eq or table.count(".") != 1 or not cols.strip():
            print(f"relay: --keys SCHEMA.TABLE=COL1,COL2, not {item!r}", file=sys.stderr)
            return 2
        keys[table] = tuple(c.strip() for c in cols.split(",") if c.strip())
    if args.restarts < 0:
        print(f"relay: --restarts N with N 0 or more, not {args.restarts}", file=sys.stderr)
        return 2
    options = {}
    for item in args.option or []:
        key, eq, value = item.partition("=")
        if not eq:
            print(f"relay: --option NAME=VALUE (a tap data source option), not {item!r}",
                  file=sys.stderr)
            return 2
        options[key] = value
    settings = MirrorSettings(
        endpoint=args.endpoint, tables=tuple(t.strip() for t in ",".join(args.tables).split(",")
                                             if t.strip()),
        target=args.target, checkpoint=args.checkpoint, source=args.source, user=args.user,
        keys=keys, name=args.name, trigger=Trigger.parse(args.trigger), buckets=args.buckets,
        chunk_rows=args.chunk_rows, chunks_per_batch=args.chunks_per_batch, options=options,
        history=args.history, restarts=args.restarts)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.appName(f"relay-mirror:{settings.prefix}")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.showConsoleProgress", "false"))
    if args.master:
        builder = builder.master(args.master)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        return MirrorJob(spark, settings).run(progress_every=args.progress_every)
    finally:
        spark.stop()


def cmd_import(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from relay.config import SyncMode, SyncPolicy
    from relay.importer import ImportProgress, import_files
    from relay.relaylog.archive import ArchiveError
    from relay.status_view import ImportView

    logging.basicConfig(level=logging.WARNING, format="relay: %(message)s")
    show = ImportView(quiet=args.quiet)

    async def run() -> ImportProgress:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        # Ctrl-C (or SIGTERM) ends the import at its last whole transaction
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            done = await import_files(args.data_dir, args.files,
                                      sync=SyncPolicy(SyncMode(args.sync)),
                                      on_progress=show.update, stop=stop)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        done.interrupted = stop.is_set()
        return done

    try:
        done = asyncio.run(run())
    except ArchiveError as exc:
        show.close()
        print(f"relay: {exc}", file=sys.stderr)
        return 1
    show.close()
    for name, offset in done.torn:
        print(f"relay: {name} ends inside an event at offset {offset} (a file still being "
              "written, or a copy cut short): what follows is left out; import the file "
              "again once it is whole", file=sys.stderr)
    for name in done.dropped:
        print(f"relay: {name} ends inside a transaction (a server that stopped in it never "
              "committed it, or a file still being written): that transaction was left out",
              file=sys.stderr)
    summary = (f"{done.files_done} file(s), {done.bytes_done / 1e6:.1f} MB, "
               f"{done.transactions} transactions into {args.data_dir}"
               + (f" ({len(done.skipped)} already there)" if done.skipped else "")
               + f"; GTID position {done.position or '(none)'}")
    if done.interrupted:
        print(f"relay: interrupted after {summary}. Run the same command again to go on.",
              file=sys.stderr)
        return 130
    print(f"relay: imported {summary}.\n  Serve it: relay run with [relay] data_dir = "
          f"\"{args.data_dir}\" and [relaylog] basename = \"{done.basename}\".",
          file=sys.stderr)
    return 0


def cmd_rules_check(args: argparse.Namespace) -> int:
    from relay.app import build_rules
    from relay.binlog.position import Position
    from relay.config import RulePoint, load_config
    from relay.errors import HookError
    from relay.rules.engine import RuleStream
    from relay.sources import SourceError, open_source

    logging.basicConfig(level=logging.WARNING, format="relay: %(message)s")
    config = load_config(args.config)
    rules = build_rules(config)
    print(f"{args.config}: {len(config.rules)} rule(s), compiled")
    for point, described in rules.describe().items():
        print(f"\n{point.value}:" + ("" if described else " (no rules: events pass as stored)"))
        for i, line in enumerate(described, 1):
            print(f"  {i}. {line}")
    if not args.sample:
        return 0
    receive, send, tap = RulePoint.RECEIVE, RulePoint.SEND, RulePoint.TAP
    audiences: list[tuple[RulePoint, str, int]] = [(receive, "", 0)]
    clients = {c for spec in rules.ruleset.specs if spec.at is send for c in spec.clients}
    if args.client or args.server_id:
        audiences.append((send, args.client or "", args.server_id or 0))
    else:
        audiences += [(send, c, 0) if isinstance(c, str) else (send, "", c)
                      for c in sorted(clients, key=str)]
        audiences.append((send, "", 0))
    tap_names = sorted({str(c) for s in rules.ruleset.specs if s.at is tap for c in s.clients})
    audiences += [(tap, n, 0) for n in tap_names] + [(tap, "", 0)]
    try:
        source = open_source(args.sample)
        events = list(source.events()) if args.limit == 0 else \
            [e for _, e in zip(range(args.limit), source.events(), strict=False)]
    except SourceError as exc:
        print(f"relay: {exc}", file=sys.stderr)
        return 2
    print(f"\nsample: {len(events)} events from {args.sample}")
    for point, client, server_id in audiences:
        handle = rules.chain(point, client, server_id)
        if not handle.chain:
            continue
        stream = RuleStream(handle.chain, hints=source.hints)
        out = 0
        stopped = ""
        for ev in events:
            try:
                out += len(stream.feed(ev.data, Position(ev.file, ev.offset)))
            except HookError as exc:  # a rule stops this stream here, as it would live
                stopped = str(exc)
                break
        else:
            out += len(stream.flush())
        who = client or (f"server_id {server_id}" if server_id else "any other client")
        label = point.value if point is receive else f"{point.value} ({who})"
        print(f"\n{label}: {len(events)} events in, {out} out")
        if stopped:
            print(f"  would stop: {stopped}")
        print(f"  {'rule':<28}{'kept':>9}{'changed':>9}{'dropped':>9}{'errors':>8}")
        for rule in handle.chain.rules:
            st = handle.chain.stats[rule.name]
            print(f"  {rule.name:<28}{st.kept:>9}{st.changed:>9}{st.dropped:>9}{st.errors:>8}")
    return 0


def _admin(args: argparse.Namespace) -> tuple[str, AdminAccess]:
    """The admin endpoint: --url, or the [metrics] listen address of --config (loopback for
    a wildcard), with the credentials and TLS [metrics] asks for."""
    from relay.status_view import AdminAccess

    if args.url is not None and args.config is None:
        return str(args.url), AdminAccess()
    from relay.config import load_config

    m = load_config(args.config).metrics
    access = AdminAccess(m.credentials(), m.tls.cert if m.tls is not None else None)
    if args.url is not None:
        return str(args.url), access
    host, _, port = m.listen.rpartition(":")
    scheme = "https" if m.tls is not None else "http"
    return f"{scheme}://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}", access


def cmd_rules_reload(args: argparse.Namespace) -> int:
    import urllib.error

    url, access = _admin(args)
    try:
        with access.open(f"{url}/-/reload", 30, post=True) as resp:
            print(resp.read().decode().strip())
            return 0
    except urllib.error.HTTPError as exc:
        print(f"relay: {exc.read().decode().strip()}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"relay: no relay answers at {url} ({exc}); is it running, and is [metrics] "
              "listen right?", file=sys.stderr)
        return 1


def cmd_status(args: argparse.Namespace) -> int:
    import urllib.error

    from rich.console import Console

    from relay.status_view import fetch_status, render

    url, access = _admin(args)
    try:
        st = fetch_status(url, access=access)
    except (urllib.error.URLError, OSError) as exc:
        print(f"relay: no relay answers at {url}/status ({exc}); is it running, and is "
              "[metrics] listen right?", file=sys.stderr)
        return 1
    Console().print(render(st))
    return 0 if st.get("ready") else 1


def cmd_demo(args: argparse.Namespace) -> int:
    from relay.demo import run_demo

    logging.basicConfig(level=logging.WARNING)
    return run_demo(duration=args.duration, rate=args.rate)


class _PrintVersion(argparse.Action):
    """--version on one line (argparse's own version action wraps it to the terminal)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="relay",
        description="A MySQL/MariaDB replication relay: mirrors a primary's binlog into a "
                    "crash-safe local relay log.")
    p.add_argument("--version", action=_PrintVersion, nargs=0,
                   help="show the version, commit, flavours and kernels, and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the relay",
                         description="Connect to the primary in [upstream] sources as a replica "
                                     "and mirror its binlog into [relay] data_dir. With no "
                                     "sources configured (or --sandbox) a throwaway local "
                                     "MariaDB primary is started and mirrored.")
    run.add_argument("--config", "-c", help="path to config.toml (default: built-in defaults)")
    run.add_argument("--sandbox", action="store_true",
                     help="start a local sandbox primary and mirror it")
    run.add_argument("--no-workload", action="store_true",
                     help="with the sandbox: do not run the small demo workload")
    run.add_argument("--data-dir", help="override [relay] data_dir")
    run.set_defaults(func=cmd_run)

    chk = sub.add_parser("check-config", help="validate a config file and exit")
    chk.add_argument("config", help="path to config.toml")
    chk.set_defaults(func=cmd_check_config)

    st = sub.add_parser("status", help="one-screen summary of a running relay",
                        description="Ask a running relay's admin endpoint ([metrics] listen) for "
                                    "its state: upstream, lag, relay log, clients. Exit status "
                                    "1 when it is not ready.")
    st.add_argument("--config", "-c", help="config.toml of the relay (for [metrics] listen)")
    st.add_argument("--url", help="admin endpoint, e.g. http://127.0.0.1:9104")
    st.set_defaults(func=cmd_status)

    demo = sub.add_parser("demo", help="sandbox primary -> relay -> sandbox replica, live view",
                          description="Start a sandbox primary, the relay and a sandbox replica "
                                      "behind it, run a light workload and show throughput, "
                                      "lag and clients live until Ctrl-C; then clean up.")
    demo.add_argument("--duration", type=float, help="stop after this many seconds")
    demo.add_argument("--rate", type=float, default=20.0, help="workload transactions/s")
    demo.set_defaults(func=cmd_demo)

    ch = sub.add_parser(
        "changes", help="print the row changes of a binlog source as JSON lines",
        description="Read SOURCE and print one JSON object per row change: gtid, server_id, "
                    "timestamp, file, pos, row, op (insert/update/delete), schema, table, "
                    "before, after. SOURCE is file:///path (a binlog file, an index file or "
                    "a directory), relay:///data_dir (a relay log) or "
                    "mysql://user:password@host:port?start=earliest|current|GTID (a live "
                    "primary). A plain path means file://.")
    ch.add_argument("source")
    ch.add_argument("--table", "-t", action="append", metavar="SCHEMA.TABLE",
                    help="only these tables; * and ? match (shop.*, *.audit); repeatable")
    ch.add_argument("--gtid", metavar="RANGE",
                    help="only transactions in this range: FROM..TO GTID positions, "
                         "inclusive (0-1-100..0-1-200, 0-1-100.., ..0-1-200), or a MySQL "
                         "GTID set")
    ch.add_argument("--follow", "-f", action="store_true",
                    help="keep waiting for new changes (like tail -f)")
    ch.add_argument("--queries", action="store_true",
                    help="print statements logged as SQL (DDL, ...) too, as op \"query\"")
    ch.add_argument("--type", action="append", metavar="SCHEMA.TABLE.COLUMN=TYPE",
                    help="a column type the binlog does not carry: uuid, inet4, inet6, json, "
                         "or datetime(N)/time(N)/timestamp(N) for MariaDB's old temporal "
                         "formats; repeatable")
    ch.add_argument("--types-from", metavar="MYSQL_URL",
                    help="read such column types from a primary's information_schema")
    ch.set_defaults(func=cmd_changes)

    mir = sub.add_parser(
        "mirror", help="keep typed Delta tables equal to a primary's tables (Spark)",
        description="Copy tables through the relay's tap into Delta tables, then keep them "
                    "equal to the primary: a snapshot, then the changes, one exactly-once "
                    "Structured Streaming query per table. Passwords come from the "
                    "environment: RELAY_TAP_PASSWORD (the tap's login) and "
                    "SNAPSHOT_PASSWORD (the snapshot source's). Needs the [mirror] extra.")
    mir.add_argument("--endpoint", required=True, help="the relay's tap, host:port")
    mir.add_argument("--tables", required=True, action="append", metavar="SCHEMA.TABLE",
                     help="tables to mirror, comma-separated or repeated; %% matches any "
                          "characters (shop.%%)")
    mir.add_argument("--target", required=True,
                     help="a directory (or object store URI): each table's Delta table goes "
                          "to TARGET/schema.table")
    mir.add_argument("--checkpoint", required=True,
                     help="a directory: each table's Spark checkpoint goes to "
                          "CHECKPOINT/schema.table; keep it with the target")
    mir.add_argument("--source", metavar="MYSQL_URL",
                     help="where snapshot reads go, mysql://user@host:port (default: the "
                          "primary the relay follows, over loopback or TLS only)")
    mir.add_argument("--user", default="", help="the tap user")
    mir.add_argument("--keys", action="append", metavar="SCHEMA.TABLE=COL1,COL2",
                     help="the key of a table without a primary key; repeatable")
    mir.add_argument("--name", help="query and subscriber names are NAME:schema.table "
                                    "(default: mirror- and a hash of the target)")
    mir.add_argument("--trigger", default="available-now",
                     help="available-now (catch up, then stop; the default) or an interval "
                          "such as \"10 seconds\" (run until SIGINT or SIGTERM)")
    mir.add_argument("--buckets", type=int, default=0,
                     help="key buckets (the Delta table's partitions) of a new target: a "
                          "merge rewrites only the buckets its keys fall in (default: one "
                          "per 25,000 rows, a power of 2; 1: no partitions)")
    mir.add_argument("--chunk-rows", type=int, default=int(DEFAULTS["snapshotchunkrows"]),
                     help="rows per snapshot chunk")
    mir.add_argument("--chunks-per-batch", type=int,
                     default=int(DEFAULTS["snapshotchunksperbatch"]),
                     help="snapshot chunks per micro-batch")
    mir.add_argument("--option", action="append", metavar="NAME=VALUE",
                     help="another option of the tap data source (tls=true, tlsCa=..., "
                          "types=..., schemaEvolution=json; a mirror's schemaEvolution is "
                          "add_columns unless given); repeatable")
    mir.add_argument("--history", action="store_true",
                     help="also keep TARGET/schema.table__history: a row per version of "
                          "each key with the interval it was valid in (SCD type 2)")
    mir.add_argument("--restarts", type=int, default=MIRROR_RESTARTS, metavar="N",
                     help="start a table's query that failed again from its checkpoint, "
                          "after 1, 2, 4, ... seconds, up to N times in a row (a query that "
                          "made progress counts from 0 again; 0: a failure stops the job; "
                          "the default rides out about 30 s of the tap or the source away)")
    mir.add_argument("--master", help="the Spark master (default: spark-submit's, or local[*])")
    mir.add_argument("--progress-every", type=float, default=30.0, metavar="SECONDS",
                     help="log each table's progress this often")
    mir.set_defaults(func=cmd_mirror)

    imp = sub.add_parser(
        "import", help="turn archived binlog files into a relay log",
        description="Import a server's binlog files (its own, `mysqlbinlog --raw` copies or "
                    "another relay's segments; MariaDB or MySQL) into a relay log in DIR, "
                    "checked: every event's size and checksum, one flavour, and one GTID "
                    "history without a gap or an overlap between the files. Each file "
                    "becomes the segment of its own name, byte for byte. Ctrl-C (or kill "
                    "-9) leaves the log at its last whole transaction: the same command "
                    "again goes on, and newer files of the same series can be added later.")
    imp.add_argument("--data-dir", required=True, metavar="DIR",
                     help="the relay log's directory (made when missing)")
    imp.add_argument("files", nargs="+", metavar="FILE",
                     help="binlog files, in any order (a glob pattern in quotes works too)")
    imp.add_argument("--sync", choices=["transaction", "off"], default="transaction",
                     help="transaction (default): each batch made durable before the "
                          "next; off: the OS decides, the log is synced at the end")
    imp.add_argument("--quiet", "-q", action="store_true", help="no progress display")
    imp.set_defaults(func=cmd_import)

    rules = sub.add_parser("rules", help="check the rules of a config, reload a running relay's")
    rsub = rules.add_subparsers(dest="rules_command", required=True, metavar="ACTION")
    rc = rsub.add_parser("check", help="compile the rules and show the chains",
                         description="Compile the [[rules]] of a config and print the chain "
                                     "each hook point runs. With --sample, run the chains over "
                                     "real events (a binlog file or a relay log) and show, "
                                     "per rule, how many events it kept, changed and dropped.")
    rc.add_argument("--config", "-c", required=True)
    rc.add_argument("--sample", metavar="SOURCE", help="file:///binlog or relay:///data_dir")
    rc.add_argument("--client", help="the send chain of this downstream user")
    rc.add_argument("--server-id", type=int, help="the send chain of this replica server_id")
    rc.add_argument("--limit", type=int, default=0, help="read at most this many events")
    rc.set_defaults(func=cmd_rules_check)
    rr = rsub.add_parser("reload", help="make a running relay read its rules again",
                         description="Ask a running relay (its admin endpoint, [metrics] "
                                     "listen) to read the rules of its config file again; "
                                     "the same as sending it SIGHUP. Wrong rules are refused "
                                     "and the old ones stay in force.")
    rr.add_argument("--config", "-c", help="config.toml of the relay (for [metrics] listen)")
    rr.add_argument("--url", help="admin endpoint, e.g. http://127.0.0.1:9104")
    rr.set_defaults(func=cmd_rules_reload)

    ins = sub.add_parser("inspect-log", help="verify and summarize a relay log directory",
                         description="Verify every segment's events and checksums and print "
                                     "a summary. Exit status 1 if anything is corrupt.")
    ins.add_argument("data_dir")
    ins.add_argument("--basename", default="relay-bin")
    ins.add_argument("--events", action="store_true", help="count events by type")
    ins.set_defaults(func=cmd_inspect_log)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"relay: {exc}", file=sys.stderr)
        return 2
    except CorruptLog as exc:
        print(f"relay: {exc}\n  The relay log is damaged; inspect it with `relay inspect-log "
              f"{os.path.dirname(exc.path)}`, or move the directory away to start afresh.",
              file=sys.stderr)
        return 3
    except FatalUpstreamError as exc:
        print(f"relay: {exc}", file=sys.stderr)
        return 4
    except RelayError as exc:
        if exc.code == "mariadb_not_installed":  # the sandbox needs a MariaDB server
            print(f"relay: {exc}. Or configure [upstream] sources to use your own primary.",
                  file=sys.stderr)
            return 5
        print(f"relay: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
