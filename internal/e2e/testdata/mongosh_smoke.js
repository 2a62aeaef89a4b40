// Run by TestMongosh (internal/e2e/mongosh_test.go) through mongobouncer.
// Each result is printed as one "key: JSON" line that the test compares
// with what it expects.
const coll = db.getCollection('smoke');
coll.drop();

const ins = coll.insertMany([
  { _id: 1, kind: 'a', n: 1 },
  { _id: 2, kind: 'b', n: 2 },
  { _id: 3, kind: 'a', n: 3 },
  { _id: 4, kind: 'b', n: 4 },
  { _id: 5, kind: 'c', n: 5 },
]);
print('inserted: ' + JSON.stringify(Object.keys(ins.insertedIds).length));
coll.insertOne({ _id: 6, kind: 'a', n: 6 });
print('count: ' + JSON.stringify(coll.countDocuments({})));

// batchSize 2 makes mongosh fetch the rest with getMore.
const found = coll.find({ kind: { $in: ['a', 'b'] } }).sort({ _id: 1 }).batchSize(2).toArray();
print('find: ' + JSON.stringify(found.map((d) => d.n)));

const agg = coll.aggregate([
  { $match: { n: { $gte: 2 } } },
  { $group: { _id: '$kind', total: { $sum: '$n' } } },
  { $sort: { _id: 1 } },
]).toArray();
print('aggregate: ' + JSON.stringify(agg));

const ping = db.runCommand({ ping: 1 });
print('ping: ' + JSON.stringify(ping.ok));
print('db: ' + JSON.stringify(db.getName()));

// A server error comes back as the server's error, not a proxy failure.
try {
  db.runCommand({ noSuchCommand: 1 });
  print('unknown command: no error');
} catch (e) {
  print('unknown command: ' + JSON.stringify(e.code));
}
