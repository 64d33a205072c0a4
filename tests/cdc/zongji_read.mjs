// Reads row changes with @vlasky/zongji from one server and prints them as JSON lines,
// until a row appears in the stop table. Used by tests/integration/test_cdc_clients.py
// to compare what the library reads from a primary and from a relay of it.
//
// usage: node zongji_read.mjs host port user password (file:NAME:POS | gtid:POS) STOP_TABLE [CA]
// With CA (a PEM file), over TLS, the server's certificate verified against it.
// With ZONGJI_UNSUPPORTED=report in the environment, the library's error for an event it
// cannot decode (a compressed transaction, a partial JSON update: it skips their rows) is
// printed as a line {"unsupported": message} and the reading goes on; otherwise it ends
// the reading as any error does.
import { readFileSync } from 'node:fs';
import ZongJi from '@vlasky/zongji';

const [host, port, user, password, start, stopTable, ca] = process.argv.slice(2);
const connection = { host, port: Number(port), user, password };
if (ca) connection.ssl = { ca: readFileSync(ca), rejectUnauthorized: true };
const zongji = new ZongJi(connection);

function plain(value) {
  if (value === null || value === undefined) return null;
  if (typeof value === 'bigint') return value.toString();
  if (Buffer.isBuffer(value)) return { hex: value.toString('hex') };
  if (value instanceof Date) return Number.isNaN(value.getTime()) ? String(value) : value.toISOString();
  if (Array.isArray(value)) return value.map(plain);
  if (typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, plain(v)]));
  }
  if (typeof value === 'number' && !Number.isFinite(value)) return String(value);
  return value;
}

let finished = false;
function finish(code) {
  if (finished) return;
  finished = true;
  zongji.stop();
  // exit once stdout (a pipe, written asynchronously) has taken every line
  process.stdout.write('', () => process.exit(code));
}

zongji.on('binlog', (evt) => {
  const kind = evt.getEventName();
  if (!['writerows', 'updaterows', 'deleterows'].includes(kind)) return;
  const table = evt.tableMap[evt.tableId];
  const name = `${table.parentSchema}.${table.tableName}`;
  for (const row of evt.rows) {
    process.stdout.write(JSON.stringify({ kind, table: name, gtid: evt.gtid ?? null, row: plain(row) }) + '\n');
  }
  if (name === stopTable) finish(0);
});
zongji.on('error', (err) => {
  if (process.env.ZONGJI_UNSUPPORTED === 'report' && err && /^Server sent a /.test(err.message)) {
    process.stdout.write(JSON.stringify({ unsupported: err.message }) + '\n');
    return;
  }
  process.stderr.write(`zongji error: ${err && err.stack ? err.stack : err}\n`);
  finish(2);
});

const options = { serverId: 4444, includeEvents: ['tablemap', 'writerows', 'updaterows', 'deleterows'] };
if (start.startsWith('gtid:')) {
  options.gtidSet = start.slice(5);
} else {
  const [, filename, position] = start.split(':');
  options.filename = filename;
  options.position = Number(position);
}
zongji.start(options);
