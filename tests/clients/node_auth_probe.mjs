// Authenticates the Node MongoDB driver to a `reshard front` (SCRAM-SHA-256) and prints, as one
// JSON object, what it was answered with a right password, a wrong one and none.
// Usage: node node_auth_probe.mjs GOOD_URI BAD_URI NONE_URI. tests/front_auth.rs runs it.
import { readFileSync } from 'node:fs';
import { MongoClient } from 'mongodb';

const [goodUri, badUri, noneUri] = process.argv.slice(2);
const { version } = JSON.parse(
  readFileSync(new URL('./node_modules/mongodb/package.json', import.meta.url), 'utf8'),
);
const error = (e) => ({ code: e.code, codeName: e.codeName, errmsg: e.errmsg ?? e.message });
const options = { serverSelectionTimeoutMS: 5000 };
const out = { client: `mongodb (Node) ${version}` };

const good = new MongoClient(goodUri, options);
const goodAdmin = good.db('admin');
const status = await goodAdmin.command({ connectionStatus: 1 });
out.good = {
  ping: (await goodAdmin.command({ ping: 1 })).ok,
  buildInfo: (await goodAdmin.command({ buildInfo: 1 })).version,
  users: status.authInfo.authenticatedUsers,
  getCmdLineOpts: (await goodAdmin.command({ getCmdLineOpts: 1 })).ok,
};
await good.close();

const bad = new MongoClient(badUri, options);
try {
  await bad.db('admin').command({ ping: 1 });
  out.bad = null;
} catch (e) {
  out.bad = error(e);
}
await bad.close();

const none = new MongoClient(noneUri, options);
const noneAdmin = none.db('admin');
out.none = {
  ping: (await noneAdmin.command({ ping: 1 })).ok,
  buildInfo: (await noneAdmin.command({ buildInfo: 1 })).version,
};
try {
  await noneAdmin.command({ getCmdLineOpts: 1 });
  out.none.getCmdLineOpts = null;
} catch (e) {
  out.none.getCmdLineOpts = error(e);
}
await none.close();
console.log(JSON.stringify(out));
