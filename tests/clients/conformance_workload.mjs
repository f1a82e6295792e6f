// The conformance workload, run by the Node MongoDB driver: prints, as one canonical extended
// JSON object, what each step answered. Usage: node conformance_workload.mjs URI DATABASE PREFIX
// BASE MODE; the same steps, arguments and output as conformance_workload.py (see there).
import { readFileSync } from 'node:fs';
import { BSON, MongoClient, MongoServerError } from 'mongodb';

const [uri, database, prefix, baseArg, mode] = process.argv.slice(2);
const base = Number(baseArg);
const [hot, a, b] = [`${prefix}-hot`, `${prefix}-a`, `${prefix}-b`];
const { version } = JSON.parse(
  readFileSync(new URL('./node_modules/mongodb/package.json', import.meta.url), 'utf8'),
);
const client = new MongoClient(uri, { serverSelectionTimeoutMS: 5000 });
const orders = client.db(database).collection('orders');
const out = [];
const step = (name, value) => out.push([name, value]);
const order = (n, customerId, total, state) => ({ _id: base + n, customerId, total, state });
const bulkError = (e) => ({
  inserted: e.result?.insertedCount ?? e.insertedCount,
  errors: (e.writeErrors ?? []).map((w) => [w.index, w.code]),
});
const update = (r) => [r.matchedCount, r.modifiedCount, r.upsertedId ?? null];
const refused = async (f) => {
  try {
    await f();
    return null;
  } catch (e) {
    if (!(e instanceof MongoServerError)) throw e;
    return e.code;
  }
};

try {
  await orders.insertMany([
    order(101, hot, 5, 'ready'), order(102, hot, 15, 'ready'), order(1, hot, 0, 'x'),
    order(103, hot, 25, 'ready'),
  ]);
  step('insert ordered', 'no error');
} catch (e) {
  step('insert ordered', bulkError(e));
}
try {
  await orders.insertMany(
    [order(104, hot, 35, 'ready'), order(101, hot, 0, 'x'), order(105, a, 45, 'new')],
    { ordered: false },
  );
  step('insert unordered', 'no error');
} catch (e) {
  step('insert unordered', bulkError(e));
}
step('insert one', (await orders.insertOne(order(106, b, 55, 'new'))).insertedId);

step('update by id', update(await orders.updateOne(
  { customerId: hot, _id: base + 2 }, { $set: { total: 21 } })));
step('update by filter', update(await orders.updateOne(
  { customerId: hot, total: { $gt: 60, $lt: 75 } }, { $set: { flag: true } })));
step('update many', update(await orders.updateMany(
  { customerId: hot, total: { $gte: 50 } }, { $inc: { total: 1 } })));
step('update many none', update(await orders.updateMany(
  { customerId: a, state: 'nothing' }, { $set: { x: 1 } })));
step('upsert new', update(await orders.updateOne(
  { customerId: a, _id: base + 200 }, { $set: { total: 7, state: 'new' } }, { upsert: true })));
step('upsert existing', update(await orders.updateOne(
  { customerId: a, _id: base + 200 }, { $inc: { total: 1 } }, { upsert: true })));
step('replace upsert', update(await orders.replaceOne(
  { customerId: b, _id: base + 201 }, { customerId: b, total: 9, state: 'new' },
  { upsert: true })));

step('findOneAndUpdate after', await orders.findOneAndUpdate(
  { customerId: hot, state: 'ready' }, { $set: { state: 'taken' } },
  { sort: { _id: 1 }, returnDocument: 'after' }));
step('findOneAndUpdate before', await orders.findOneAndUpdate(
  { customerId: hot, state: 'ready' }, { $set: { state: 'taken' } },
  { sort: { total: -1 }, returnDocument: 'before' }));
step('findOneAndUpdate none', await orders.findOneAndUpdate(
  { customerId: hot, state: 'nothing' }, { $set: { state: 'taken' } }));
step('findOneAndUpdate upsert', await orders.findOneAndUpdate(
  { customerId: b, _id: base + 202 }, { $set: { total: 3 } },
  { upsert: true, returnDocument: 'after' }));
step('findOneAndReplace', await orders.findOneAndReplace(
  { customerId: b, _id: base + 15 }, { customerId: b, total: 0, state: 'replaced' },
  { returnDocument: 'after' }));
step('findOneAndReplace projection', await orders.findOneAndReplace(
  { customerId: a, _id: base + 12 }, { customerId: a, total: 1, state: 'replaced' },
  { projection: { total: 1, _id: 0 } }));
step('findOneAndDelete', await orders.findOneAndDelete({ customerId: a, _id: base + 11 }));
step('findOneAndDelete sorted', await orders.findOneAndDelete(
  { customerId: hot, state: 'done' }, { sort: { total: 1 } }));

step('deleteOne', (await orders.deleteOne({ customerId: hot, _id: base + 3 })).deletedCount);
step('deleteOne none',
  (await orders.deleteOne({ customerId: hot, _id: base + 999 })).deletedCount);
step('deleteMany', (await orders.deleteMany(
  { customerId: hot, state: 'done', total: { $lt: 90 } })).deletedCount);

step('find sorted', await orders.find(
  { customerId: hot, total: { $gt: 20 } },
  { projection: { total: 1, state: 1 }, sort: { total: -1 }, skip: 1, limit: 5, batchSize: 2 },
).toArray());
step('find $in', await orders.find(
  { customerId: hot, state: { $in: ['ready', 'taken'] } }, { sort: { _id: 1 }, batchSize: 2 },
).toArray());
step('find tenants', await orders.find(
  { customerId: { $in: [a, b] } },
  { projection: { _id: 0, customerId: 1, total: 1 }, sort: { customerId: 1, total: -1 },
    batchSize: 3 },
).toArray());
step('find one', await orders.findOne({ customerId: hot, _id: base + 5 }));
step('find none', await orders.findOne({ customerId: hot, _id: base + 3 }));
step('find and', await orders.find(
  { $and: [{ customerId: hot }, { total: { $lte: 80 } }], state: { $ne: 'taken' } },
  { sort: { total: 1, _id: 1 }, limit: 3 },
).toArray());

step('count', await orders.countDocuments({ customerId: hot }));
step('count filtered', await orders.countDocuments({ customerId: hot, total: { $lt: 50 } }));
step('count skip limit', await orders.countDocuments({ customerId: hot }, { skip: 2, limit: 3 }));
step('distinct', (await orders.distinct('state', { customerId: hot }))
  .sort((x, y) => String(x).localeCompare(String(y))));
step('distinct tenants', (await orders.distinct('customerId', { customerId: { $in: [a, b] } }))
  .sort());
step('aggregate', await orders.aggregate([
  { $match: { customerId: hot } },
  { $group: { _id: '$state', n: { $sum: 1 }, total: { $sum: '$total' } } },
  { $sort: { _id: 1 } },
]).toArray());
step('aggregate batches', await orders.aggregate([
  { $match: { customerId: { $in: [hot, a] } } },
  { $sort: { _id: 1 } },
  { $project: { total: 1 } },
], { batchSize: 2 }).toArray());

for (const tenant of [hot, a, b]) {
  step(`final ${tenant.slice(prefix.length)}`,
    await orders.find({ customerId: tenant }, { sort: { _id: 1 } }).toArray());
}

const result = { client: `mongodb (Node) ${version}`, steps: out };
if (mode === 'front') {
  result.refused = {
    'no tenant': await refused(() => orders.find({ total: 50 }).toArray()),
    lookup: await refused(() => orders.aggregate([
      { $match: { customerId: hot } },
      { $lookup: { from: 'x', as: 'y', localField: 'a', foreignField: 'b' } },
    ]).toArray()),
    watch: await refused(async () => {
      const stream = orders.watch();
      try {
        await stream.tryNext();
      } finally {
        await stream.close();
      }
    }),
  };
}
await client.close();
// Canonical extended JSON: an int32, an int64 and a double stay apart.
console.log(BSON.EJSON.stringify(result, { relaxed: false }));
