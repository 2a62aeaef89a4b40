// Watches mongobouncer's drain with the Node driver (tools/node's mongodb
// package, found through NODE_PATH): it connects with a 10s heartbeat in
// the given monitoring mode, pings, prints "ready", and then prints
// "unknown <ms>" when its topology marks the server Unknown, <ms> after the
// "go" line arrives on stdin. It exits 1 if that takes over 15s.
const { MongoClient } = require('mongodb');
const readline = require('readline');

async function main(uri, mode) {
  const client = new MongoClient(uri, {
    serverSelectionTimeoutMS: 10000,
    heartbeatFrequencyMS: 10000,
    serverMonitoringMode: mode,
  });
  let goAt = 0;
  let awaited = 0;
  let done;
  const seen = new Promise((resolve) => { done = resolve; });
  client.on('serverHeartbeatSucceeded', (ev) => { if (ev.awaited) awaited++; });
  client.on('serverDescriptionChanged', (ev) => {
    if (goAt > 0 && ev.newDescription.type === 'Unknown') {
      done(Date.now() - goAt);
    }
  });
  await client.db('test').command({ ping: 1 });
  const rl = readline.createInterface({ input: process.stdin });
  rl.on('line', (line) => { if (line === 'go') goAt = Date.now(); });
  console.log('ready');
  const timer = setTimeout(() => done(-1), 15000);
  const ms = await seen;
  clearTimeout(timer);
  rl.close();
  console.log('unknown ' + ms + ' awaited ' + awaited);
  await client.close(true);
  if (ms < 0) process.exit(1);
}

main(process.argv[2], process.argv[3]).catch((err) => {
  console.error(err);
  process.exit(1);
});
