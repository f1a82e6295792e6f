// Run by mongosh (`mongosh URI --quiet --file mongosh_probe.js`) against a `reshard front`:
// prints, as one JSON object, what it was answered. Before this runs, mongosh has already sent
// its own connect-time commands (buildInfo, getCmdLineOpts, getLog, ...).
const admin = db.getSiblingDB('admin');
const out = { client: `mongosh ${version()}` };
out.ping = admin.runCommand({ ping: 1 });
const hello = admin.runCommand({ hello: 1 });
delete hello.localTime;
out.hello = hello;
out.buildInfo = admin.runCommand({ buildInfo: 1 }).version;
try {
  const reply = admin.runCommand({ frobnicate: 1 });
  out.unknown = { code: reply.code, codeName: reply.codeName, errmsg: reply.errmsg };
} catch (e) {
  out.unknown = { code: e.code, codeName: e.codeName, errmsg: e.errmsg ?? e.message };
}
print(JSON.stringify(out));
