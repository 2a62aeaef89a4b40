// Connects with the Node driver (tools/node's mongodb package, found
// through NODE_PATH), writes and reads one document and closes. close()
// ends the client's pooled sessions with an endSessions command sent with
// moreToCome (noResponse).
const { MongoClient } = require('mongodb');

async function main(uri) {
  const client = new MongoClient(uri, { serverSelectionTimeoutMS: 10000 });
  try {
    const coll = client.db('test').collection('node_close');
    await coll.insertOne({ at: new Date() });
    const n = await coll.countDocuments({});
    console.log('count > 0: ' + (n > 0));
  } finally {
    await client.close();
  }
}

main(process.argv[2]).catch((err) => {
  console.error(err);
  process.exit(1);
});
