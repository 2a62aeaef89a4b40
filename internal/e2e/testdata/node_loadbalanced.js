// Connects with the Node driver (tools/node's mongodb package, found
// through NODE_PATH) in load-balanced mode and checks what the driver
// saw: a find in batches of 5 with its getMores, an abandoned cursor's
// killCursors, and a committed and an aborted transaction, each on one
// connection and every command with the serviceId given as argv[3].
// Exits non-zero with a message on the first difference.
const { MongoClient } = require('mongodb');

function fail(msg) {
  throw new Error(msg);
}

function checkPinned(what, cmds, wantNames, serviceId) {
  const names = cmds.map((c) => c.name).join(' ');
  if (names !== wantNames) fail(`${what}: commands "${names}", want "${wantNames}"`);
  for (const c of cmds) {
    if (c.conn !== cmds[0].conn) fail(`${what}: ${c.name} on connection ${c.conn}, the first on ${cmds[0].conn}`);
    if (c.serviceId !== serviceId) fail(`${what}: ${c.name} has serviceId ${c.serviceId}, want ${serviceId}`);
  }
}

async function main(uri, serviceId) {
  const client = new MongoClient(uri, { serverSelectionTimeoutMS: 10000, monitorCommands: true });
  let cmds = [];
  client.on('commandStarted', (e) => {
    if (e.commandName === 'endSessions') return;
    cmds.push({ name: e.commandName, conn: e.connectionId, serviceId: e.serviceId && e.serviceId.toHexString() });
  });
  try {
    const coll = client.db('lbnode').collection('items');
    await coll.insertMany([...Array(23).keys()].map((i) => ({ _id: i })));

    cmds = [];
    const docs = await coll.find({}, { batchSize: 5 }).toArray();
    if (docs.length !== 23) fail(`find read ${docs.length} documents, want 23`);
    checkPinned('find in batches', cmds, 'find getMore getMore getMore getMore', serviceId);

    cmds = [];
    const cur = coll.find({}, { batchSize: 5 });
    for (let i = 0; i < 7; i++) {
      if ((await cur.next()) === null) fail('cursor ended early');
    }
    await cur.close();
    checkPinned('abandoned cursor', cmds, 'find getMore killCursors', serviceId);

    const orders = client.db('lbnode').collection('orders');
    for (const commit of [true, false]) {
      const session = client.startSession();
      try {
        cmds = [];
        session.startTransaction();
        await orders.insertOne({ commit, i: 0 }, { session });
        await orders.insertOne({ commit, i: 1 }, { session });
        if (commit) await session.commitTransaction();
        else await session.abortTransaction();
        checkPinned(commit ? 'committed transaction' : 'aborted transaction', cmds,
          `insert insert ${commit ? 'commitTransaction' : 'abortTransaction'}`, serviceId);
      } finally {
        await session.endSession();
      }
    }
    const kept = await orders.find({}).toArray();
    if (kept.length !== 2 || kept.some((d) => !d.commit)) fail(`orders after commit and abort: ${JSON.stringify(kept)}`);
    console.log('ok');
  } finally {
    await client.close();
  }
}

main(process.argv[2], process.argv[3]).catch((err) => {
  console.error(err);
  process.exit(1);
});
