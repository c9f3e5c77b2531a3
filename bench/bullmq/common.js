// Shared by the BullMQ worker and producer: command-line options and the Redis connection.
'use strict';

function options(argv) {
  const out = {};
  for (let i = 2; i < argv.length; i += 2) out[argv[i].replace(/^--/, '')] = argv[i + 1];
  return out;
}

// ioredis options from a redis:// URL (BullMQ passes them to ioredis).
function connection(url) {
  const u = new URL(url);
  const conn = { host: u.hostname, port: Number(u.port || 6379), maxRetriesPerRequest: null };
  const db = u.pathname.replace('/', '');
  if (db) conn.db = Number(db);
  if (u.username) conn.username = decodeURIComponent(u.username);
  if (u.password) conn.password = decodeURIComponent(u.password);
  if (u.protocol === 'rediss:') conn.tls = {};
  return conn;
}

function say(line) {
  process.stdout.write(line + '\n');
}

module.exports = { options, connection, say };
