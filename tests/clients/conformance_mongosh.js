// The conformance workload, run by mongosh (`mongosh URI --quiet --norc --file
// conformance_mongosh.js`, with CONFORMANCE_DATABASE, CONFORMANCE_PREFIX, CONFORMANCE_BASE and
// CONFORMANCE_MODE in the environment): the same steps as conformance_workload.py (see there),
// printed as one canonical extended JSON object. Ids are NumberInt, int32 as the other clients'
// are (a double id cannot be routed on a tenant of many buckets).
const env = process.env;
const database = env.CONFORMANCE_DATABASE;
const prefix = env.CONFORMANCE_PREFIX;
const base = Number(env.CONFORMANCE_BASE);
const mode = env.CONFORMANCE_MODE;
const [hot, a, b] = [`${prefix}-hot`, `${prefix}-a`, `${prefix}-b`];
const orders = db.getSiblingDB(database).getCollection('orders');
const out = [];
const step = (name, value) => out.push([name, value]);
const id = (n) => NumberInt(base + n);
const order = (n, customerId, total, state) => ({ _id: id(n), customerId, total, state });
const bulkError = (e) => ({
  inserted: e.result?.insertedCount ?? e.insertedCount,
  errors: (e.writeErrors ?? []).map((w) => [w.index, w.code]),
});
// mongosh names the upserted id `insertedId`.
const update = (r) => [r.matchedCount, r.modifiedCount, r.insertedId ?? null];
const refused = (f) => {
  try {
    f();
    return null;
  } catch (e) {
    if (e.code === undefined) throw e;
    return e.code;
  }
};

try {
  orders.insertMany([
    order(101, hot, 5, 'ready'), order(102, hot, 15, 'ready'), order(1, hot, 0, 'x'),
    order(103, hot, 25, 'ready'),
  ]);
  step('insert ordered', 'no error');
} catch (e) {
  step('insert ordered', bulkError(e));
}
try {
  orders.insertMany(
    [order(104, hot, 35, 'ready'), order(101, hot, 0, 'x'), order(105, a, 45, 'new')],
    { ordered: false },
  );
  step('insert unordered', 'no error');
} catch (e) {
  step('insert unordered', bulkError(e));
}
step('insert one', orders.insertOne(order(106, b, 55, 'new')).insertedId);

step('update by id', update(orders.updateOne(
  { customerId: hot, _id: id(2) }, { $set: { total: 21 } })));
step('update by filter', update(orders.updateOne(
  { customerId: hot, total: { $gt: 60, $lt: 75 } }, { $set: { flag: true } })));
step('update many', update(orders.updateMany(
  { customerId: hot, total: { $gte: 50 } }, { $inc: { total: 1 } })));
step('update many none', update(orders.updateMany(
  { customerId: a, state: 'nothing' }, { $set: { x: 1 } })));
step('upsert new', update(orders.updateOne(
  { customerId: a, _id: id(200) }, { $set: { total: 7, state: 'new' } }, { upsert: true })));
step('upsert existing', update(orders.updateOne(
  { customerId: a, _id: id(200) }, { $inc: { total: 1 } }, { upsert: true })));
step('replace upsert', update(orders.replaceOne(
  { customerId: b, _id: id(201) }, { customerId: b, total: 9, state: 'new' },
  { upsert: true })));

step('findOneAndUpdate after', orders.findOneAndUpdate(
  { customerId: hot, state: 'ready' }, { $set: { state: 'taken' } },
  { sort: { _id: 1 }, returnDocument: 'after' }));
step('findOneAndUpdate before', orders.findOneAndUpdate(
  { customerId: hot, state: 'ready' }, { $set: { state: 'taken' } },
  { sort: { total: -1 }, returnDocument: 'before' }));
step('findOneAndUpdate none', orders.findOneAndUpdate(
  { customerId: hot, state: 'nothing' }, { $set: { state: 'taken' } }));
step('findOneAndUpdate upsert', orders.findOneAndUpdate(
  { customerId: b, _id: id(202) }, { $set: { total: 3 } },
  { upsert: true, returnDocument: 'after' }));
step('findOneAndReplace', orders.findOneAndReplace(
  { customerId: b, _id: id(15) }, { customerId: b, total: 0, state: 'replaced' },
  { returnDocument: 'after' }));
step('findOneAndReplace projection', orders.findOneAndReplace(
  { customerId: a, _id: id(12) }, { customerId: a, total: 1, state: 'replaced' },
  { projection: { total: 1, _id: 0 } }));
step('findOneAndDelete', orders.findOneAndDelete({ customerId: a, _id: id(11) }));
step('findOneAndDelete sorted', orders.findOneAndDelete(
  { customerId: hot, state: 'done' }, { sort: { total: 1 } }));

step('deleteOne', orders.deleteOne({ customerId: hot, _id: id(3) }).deletedCount);
step('deleteOne none', orders.deleteOne({ customerId: hot, _id: id(999) }).deletedCount);
step('deleteMany', orders.deleteMany(
  { customerId: hot, state: 'done', total: { $lt: 90 } }).deletedCount);

step('find sorted', orders.find({ customerId: hot, total: { $gt: 20 } }, { total: 1, state: 1 })
  .sort({ total: -1 }).skip(1).limit(5).batchSize(2).toArray());
step('find $in', orders.find({ customerId: hot, state: { $in: ['ready', 'taken'] } })
  .sort({ _id: 1 }).batchSize(2).toArray());
step('find tenants', orders.find(
  { customerId: { $in: [a, b] } }, { _id: 0, customerId: 1, total: 1 },
).sort({ customerId: 1, total: -1 }).batchSize(3).toArray());
step('find one', orders.findOne({ customerId: hot, _id: id(5) }));
step('find none', orders.findOne({ customerId: hot, _id: id(3) }));
step('find and', orders.find(
  { $and: [{ customerId: hot }, { total: { $lte: 80 } }], state: { $ne: 'taken' } },
).sort({ total: 1, _id: 1 }).limit(3).toArray());

step('count', orders.countDocuments({ customerId: hot }));
step('count filtered', orders.countDocuments({ customerId: hot, total: { $lt: 50 } }));
step('count skip limit', orders.countDocuments({ customerId: hot }, { skip: 2, limit: 3 }));
step('distinct', orders.distinct('state', { customerId: hot })
  .sort((x, y) => String(x).localeCompare(String(y))));
step('distinct tenants', orders.distinct('customerId', { customerId: { $in: [a, b] } }).sort());
step('aggregate', orders.aggregate([
  { $match: { customerId: hot } },
  { $group: { _id: '$state', n: { $sum: 1 }, total: { $sum: '$total' } } },
  { $sort: { _id: 1 } },
]).toArray());
step('aggregate batches', orders.aggregate([
  { $match: { customerId: { $in: [hot, a] } } },
  { $sort: { _id: 1 } },
  { $project: { total: 1 } },
], { batchSize: 2 }).toArray());

for (const tenant of [hot, a, b]) {
  step(`final ${tenant.slice(prefix.length)}`,
    orders.find({ customerId: tenant }).sort({ _id: 1 }).toArray());
}

const result = { client: `mongosh ${version()}`, steps: out };
if (mode === 'front') {
  result.refused = {
    'no tenant': refused(() => orders.find({ total: 50 }).toArray()),
    lookup: refused(() => orders.aggregate([
      { $match: { customerId: hot } },
      { $lookup: { from: 'x', as: 'y', localField: 'a', foreignField: 'b' } },
    ]).toArray()),
    watch: refused(() => {
      const stream = orders.watch();
      try {
        stream.tryNext();
      } finally {
        stream.close();
      }
    }),
  };
}
// Canonical extended JSON: an int32, an int64 and a double stay apart.
print(EJSON.stringify(result, { relaxed: false }));
