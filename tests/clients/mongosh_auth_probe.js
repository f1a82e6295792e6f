// Run by mongosh without a connection (`mongosh --nodb --quiet --norc --file
// mongosh_auth_probe.js`), with GOOD_URI, BAD_URI and NONE_URI in its environment: connects to a
// `reshard front` with a right password, a wrong one and none, then authenticates the last
// connection with `db.auth()`, and prints, as one JSON object, what it was answered.
// tests/front_auth.rs runs it and checks the answers.
const error = (e) => ({ code: e.code, codeName: e.codeName, errmsg: e.errmsg ?? e.message });
const out = { client: `mongosh ${version()}` };

const good = connect(process.env.GOOD_URI).getSiblingDB('admin');
out.good = {
  ping: good.runCommand({ ping: 1 }).ok,
  buildInfo: good.runCommand({ buildInfo: 1 }).version,
  users: good.runCommand({ connectionStatus: 1 }).authInfo.authenticatedUsers,
  getCmdLineOpts: good.runCommand({ getCmdLineOpts: 1 }).ok,
};

try {
  connect(process.env.BAD_URI).getSiblingDB('admin').runCommand({ ping: 1 });
  out.bad = null;
} catch (e) {
  out.bad = error(e);
}

const none = connect(process.env.NONE_URI).getSiblingDB('admin');
out.none = {
  ping: none.runCommand({ ping: 1 }).ok,
  buildInfo: none.runCommand({ buildInfo: 1 }).version,
};
try {
  const reply = none.runCommand({ getCmdLineOpts: 1 });
  out.none.getCmdLineOpts = reply.ok === 1 ? null : error(reply);
} catch (e) {
  out.none.getCmdLineOpts = error(e);
}
// The shell's own way in: db.auth() on the connection that had no credentials.
const [user, password] = [process.env.AUTH_USER, process.env.AUTH_PASSWORD];
out.dbAuth = { auth: none.auth(user, password).ok };
out.dbAuth.users = none.runCommand({ connectionStatus: 1 }).authInfo.authenticatedUsers;
out.dbAuth.getCmdLineOpts = none.runCommand({ getCmdLineOpts: 1 }).ok;
print(JSON.stringify(out));
