// Connects the Node MongoDB driver to a `reshard front` and prints, as one JSON object, what it
// was answered. Usage: node node_probe.mjs URI. tests/front_wire.rs runs it and checks the answers.
import { readFileSync } from 'node:fs';
import { MongoClient } from 'mongodb';

const uri = process.argv[2];
const { version } = JSON.parse(
  readFileSync(new URL('./node_modules/mongodb/package.json', import.meta.url), 'utf8'),
);
const client = new MongoClient(uri, { serverSelectionTimeoutMS: 5000 });
const admin = client.db('admin');
const out = { client: `mongodb (Node) ${version}` };
out.ping = await admin.command({ ping: 1 });
const hello = await admin.command({ hello: 1 });
delete hello.localTime;
out.hello = hello;
out.buildInfo = (await admin.command({ buildInfo: 1 })).version;
try {
  await admin.command({ frobnicate: 1 });
  out.unknown = null;
} catch (e) {
  out.unknown = { code: e.code, codeName: e.codeName, errmsg: e.errmsg ?? e.message };
}
await client.close();
console.log(JSON.stringify(out));
