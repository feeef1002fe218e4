// brisk's Node.js runner: loads a function from source and serves it over
// HTTP/1.1 (node runner.js). Configuration comes from the environment:
//
//   PORT               TCP port to listen on (8080 when unset)
//   BRISK_LISTEN_HOST  address to bind (127.0.0.1)
//   BRISK_CODE_DIR     the function's unpacked code: the working directory,
//                      and where the handler's module is found
//   BRISK_HANDLER      MODULE.EXPORT (index.handler: index.js, index.mjs,
//                      index.cjs or index/index.js, in that order, and its
//                      export "handler"; a.b.fn is a/b.js's fn), or MODULE
//                      alone when the module is the function
//                      (module.exports = async (event, context) => ..., or
//                      an ES module's default export)
//   BRISK_CONTRACT     "lambda" (AWS Lambda's handler(event, context[,
//                      callback]), the default) or "http" (OpenFaaS's node
//                      templates' (event, context))
//   BRISK_FUNCTION     the function's name (AWS_LAMBDA_FUNCTION_NAME when
//                      unset)
//   BRISK_TIMEOUT_MS   the call timeout, for getRemainingTimeInMillis
//                      (300000)
//   BRISK_MEMORY_MB    memoryLimitInMB (128)
//
// The handler is loaded before the port is bound: brisk's readiness probe is
// a TCP connect, so a function that cannot load never listens. The runner
// prints the error's stack, then as its last line of stderr "brisk: cannot
// load handler H: reason", and exits with status 1.
//
// Startup snapshots. Run as
//
//   node --snapshot-blob BLOB --build-snapshot runner.js
//
// (with the environment above) the runner loads the handler as it would
// before serving, node runs the event loop until nothing keeps it alive,
// then writes its heap, handler and modules loaded, to BLOB (relative to
// the working directory it was started in); `node --snapshot-blob BLOB`
// then starts from that heap and the runner serves at once. A handler
// that cannot load fails the build as it fails a start (status 1). One
// that cannot be in a snapshot makes the build print "brisk: cannot
// snapshot handler H: reason" last and exit with status 3: an ES module,
// a native addon, a built-in module node cannot snapshot (http, https,
// tls...), an interval or unref'd timer started as it loads. Node itself
// may fail the build otherwise (V8 aborts on a handle it cannot
// serialise: a socket left open). Start a function whose build failed
// fresh: that start is what says whether it loads.
//
// A process started from a snapshot reads its environment when it starts
// (PORT, BRISK_LISTEN_HOST, BRISK_FUNCTION, ... and process.env as the
// handler sees it), not the build's; what the handler's modules computed
// as they loaded, from the environment or otherwise, is the build's.
// BRISK_HANDLER and BRISK_CODE_DIR, when set, must be the build's.
'use strict';

// When building a snapshot, node warns on stderr of each built-in module
// not verified in snapshots that the script requires (v8, module, vm and
// async_hooks among the runner's); the runner's use of them is tested, and
// those warnings are dropped.
function builtin(id) {
  const own = Object.getOwnPropertyDescriptor(process, 'emit');
  const emit = process.emit;
  process.emit = function (name, w, ...rest) {
    if (name === 'warning' && w instanceof Error && String(w.message).startsWith("It's not yet fully verified whether built-in module")) {
      return false;
    }
    return Reflect.apply(emit, this, [name, w, ...rest]);
  };
  try {
    return require(id);
  } finally {
    if (own === undefined) delete process.emit;
    else Object.defineProperty(process, 'emit', own);
  }
}

// node --build-snapshot runs the script without CommonJS's wrapper (no
// module): a start does not pay the 2 ms require('v8') takes.
const building = typeof module === 'undefined' && builtin('v8').startupSnapshot.isBuildingSnapshot();

// Node cannot put http in a snapshot: a process started from one loads it
// as it starts.
let http = building ? null : require('http');
const fs = require('fs');
const path = require('path');
const querystring = require('querystring');
const { randomUUID, randomBytes, randomInt } = require('crypto');
const { pathToFileURL } = require('url');

const MAX_HEAD = 64 << 10; // request line and header lines (431 beyond)
const MAX_BODY = 64 << 20; // request body (413 beyond)

const JSON_TYPE = 'application/json';
const TEXT_TYPE = 'text/plain; charset=utf-8';
const OCTET_TYPE = 'application/octet-stream';

const env = process.env;

function positive(s, def) {
  const n = Number.parseInt(s, 10);
  return n > 0 ? n : def;
}

// The settings from the environment (configure); read again by a process
// started from a snapshot.
let functionName, timeoutMs, memoryMB, contract, handlerName, arn, logGroup;
let logStream = '';

function configure() {
  functionName = env.BRISK_FUNCTION || env.AWS_LAMBDA_FUNCTION_NAME || '';
  timeoutMs = positive(env.BRISK_TIMEOUT_MS, 300000);
  memoryMB = String(positive(env.BRISK_MEMORY_MB, 128));
  contract = env.BRISK_CONTRACT || 'lambda';
  handlerName = env.BRISK_HANDLER || '';
  arn = 'arn:aws:lambda:brisk:000000000000:function:' + functionName;
  logGroup = '/aws/lambda/' + functionName;
}

let handler = null; // the user's function, once loaded

// A context's hidden slots: the function that settles its call, and the
// value context.succeed was given (SUCCEEDED is what it settles with).
const SETTLE = Symbol('settle');
const VALUE = Symbol('value');
const SUCCEEDED = Symbol('succeeded');

// ------------------------------------------------------------- loading

// A reason the handler cannot load that is the runner's own finding: its
// message alone is the reason, and it has no stack worth printing.
class LoadError extends Error {}

function isFile(p) {
  try {
    return fs.statSync(p).isFile();
  } catch {
    return false;
  }
}

function checkContract() {
  if (contract !== 'lambda' && contract !== 'http') {
    throw new LoadError(`contract "${contract}" is not "lambda" or "http"`);
  }
}

// findHandler changes to the code's directory and finds the handler's
// module: its file (as found, and its path), and the export named.
function findHandler() {
  checkContract();
  const dir = path.resolve(env.BRISK_CODE_DIR || '.');
  process.chdir(dir);
  const dot = handlerName.lastIndexOf('.');
  const module = dot < 0 ? handlerName : handlerName.slice(0, dot);
  const name = dot < 0 ? '' : handlerName.slice(dot + 1);
  if (!module || (dot >= 0 && !name)) {
    throw new LoadError(`handler "${handlerName}" is not MODULE.FUNCTION or MODULE`);
  }
  const rel = module.split('.').join('/');
  const tried = [rel + '.js', rel + '.mjs', rel + '.cjs', rel + '/index.js'];
  const found = tried.find((f) => isFile(path.join(dir, f)));
  if (found === undefined) {
    throw new LoadError(`Error: Cannot find module '${rel}' in ${dir} (tried ${tried.join(', ')})`);
  }
  return { dir, found, file: path.join(dir, found), name };
}

async function loadHandler() {
  const { found, file, name } = findHandler();
  let m;
  let esm = false;
  if (found.endsWith('.mjs')) {
    m = await import(pathToFileURL(file).href);
    esm = true;
  } else {
    try {
      m = require(file);
    } catch (e) {
      if (!e || e.code !== 'ERR_REQUIRE_ESM') throw e;
      m = await import(pathToFileURL(file).href); // a .js file of a "type": "module" package
      esm = true;
    }
  }
  return handlerIn(m, esm, found, name);
}

// handlerIn is the function named in the module m (its exports or, when
// esm, its namespace) of the file found.
function handlerIn(m, esm, found, name) {
  let fn;
  if (name === '') {
    // The module is the function: module.exports, an ES module's default
    // export, or a transpiled module's exports.default.
    fn = esm ? m.default : m;
    if (typeof fn !== 'function' && !esm && m != null && typeof m.default === 'function') fn = m.default;
    if (typeof fn !== 'function') {
      const what = esm ? 'default export' : 'module.exports';
      throw new LoadError(fn === undefined ? `${found} has no ${what}` : `${found}'s ${what} is not a function (${typeof fn})`);
    }
    return fn;
  }
  fn = m == null ? undefined : m[name];
  if (fn === undefined) throw new LoadError(`${found} has no export "${name}"`);
  if (typeof fn !== 'function') throw new LoadError(`${found}'s export "${name}" is not a function (${typeof fn})`);
  return fn;
}

function cannotLoad(err) {
  let reason;
  if (err instanceof LoadError) {
    reason = err.message;
  } else {
    if (err instanceof Error || (err && err.stack)) {
      process.stderr.write(String(err.stack || err) + '\n');
    }
    reason = errorLine(err);
  }
  process.stderr.write(`brisk: cannot load handler ${handlerName}: ${reason}\n`);
  process.exit(1);
}

// errorLine is "Name: message" for an Error (its message's first line),
// else the thrown value as a string.
function errorLine(err) {
  try {
    if (err instanceof Error || (err && typeof err.message === 'string')) {
      const msg = String(err.message).split('\n')[0];
      const name = err.name || 'Error';
      return msg ? `${name}: ${msg}` : name;
    }
    return `${typeof err}: ${String(err)}`;
  } catch {
    return 'unprintable error';
  }
}

// ------------------------------------------------------------- serving

const SERVER_OPTIONS = {
  maxHeaderSize: MAX_HEAD,
  // Only for receiving a request (a handler may run longer).
  requestTimeout: 300000,
  headersTimeout: 66000,
  noDelay: true,
};

function serve() {
  const d = new Date();
  const pad = (n) => String(n).padStart(2, '0');
  logStream = `${d.getUTCFullYear()}/${pad(d.getUTCMonth() + 1)}/${pad(d.getUTCDate())}/[$LATEST]${randomBytes(16).toString('hex')}`;
  const call = contract === 'http' ? httpCall : lambdaCall;
  const server = http.createServer(
    SERVER_OPTIONS,
    (req, res) => {
      const cl = req.headers['content-length'];
      if (cl !== undefined && Number(cl) > MAX_BODY) {
        refuse(req, res, 413, 'request body too large\n');
        return;
      }
      if (cl === '0' || (cl === undefined && req.headers['transfer-encoding'] === undefined)) {
        req.resume(); // no body
        call(req, EMPTY, res);
        return;
      }
      const chunks = [];
      let n = 0;
      req.on('data', (c) => {
        n += c.length;
        if (n > MAX_BODY) {
          if (!res.headersSent) refuse(req, res, 413, 'request body too large\n');
          return;
        }
        chunks.push(c);
      });
      req.on('end', () => {
        if (n > MAX_BODY) return;
        call(req, chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, n), res);
      });
    },
  );
  // The caller (brisk's proxy) keeps connections to reuse: idle ones are
  // kept longer than it keeps them.
  server.keepAliveTimeout = 65000;
  server.on('error', (e) => {
    if (server.listening) {
      process.stderr.write(`brisk: server: ${e.message}\n`); // accept's EMFILE and the like
      return;
    }
    process.stderr.write(`brisk: cannot listen: ${e.message}\n`);
    process.exit(1);
  });
  server.listen(positive(env.PORT, 8080), env.BRISK_LISTEN_HOST || '127.0.0.1');
  return server;
}

const EMPTY = Buffer.alloc(0);

function refuse(req, res, status, msg) {
  res.writeHead(status, { 'Content-Type': TEXT_TYPE, 'Content-Length': Buffer.byteLength(msg), Connection: 'close' });
  res.end(msg);
  req.removeAllListeners('data');
  req.resume();
}

// send writes a reply of the runner's own making.
function send(res, status, type, body) {
  if (status === 204 || status === 304) {
    res.writeHead(status);
    res.end();
    return;
  }
  res.writeHead(status, { 'Content-Type': type, 'Content-Length': Buffer.byteLength(body) });
  res.end(body);
}

// settle calls the handler as Lambda's runtime does, and calls
// done(failed, value) once: with what the promise it returns settles with;
// else, for a handler taking a callback (three parameters), when it calls
// it; else with the value it returns. The context's done/succeed/fail
// settle it too, whichever comes first.
function settle(fn, event, ctx, done) {
  let settled = false;
  const finish = (failed, value) => {
    if (settled) return;
    settled = true;
    done(failed, value);
  };
  const callback = (err, value) => (err !== undefined && err !== null ? finish(true, err) : finish(false, value));
  ctx[SETTLE] = finish;
  let r;
  try {
    r = fn(event, ctx, callback);
  } catch (e) {
    finish(true, e);
    return;
  }
  if (r !== null && (typeof r === 'object' || typeof r === 'function') && typeof r.then === 'function') {
    r.then(
      (v) => finish(false, v),
      (e) => finish(true, e),
    );
  } else if (fn.length < 3) {
    finish(false, r);
  }
}

// ------------------------------------------------------------- lambda

class LambdaContext {
  #deadline;
  constructor(requestId, deadline, clientContext) {
    this.callbackWaitsForEmptyEventLoop = true;
    this.functionName = functionName;
    this.functionVersion = '$LATEST';
    this.invokedFunctionArn = arn;
    this.memoryLimitInMB = memoryMB;
    this.awsRequestId = requestId;
    this.logGroupName = logGroup;
    this.logStreamName = logStream;
    this.identity = undefined;
    this.clientContext = clientContext;
    this.#deadline = deadline;
  }
  getRemainingTimeInMillis() {
    return Math.max(0, this.#deadline - Date.now());
  }
  // Lambda's legacy completion methods.
  done(err, value) {
    if (err !== undefined && err !== null) this[SETTLE](true, err);
    else this[SETTLE](false, value);
  }
  succeed(value) {
    this[SETTLE](false, value);
  }
  fail(err) {
    this[SETTLE](true, err);
  }
}

function clientContext(h) {
  if (!h) return undefined;
  try {
    const v = JSON.parse(Buffer.from(h, 'base64').toString('utf8'));
    return v !== null && typeof v === 'object' ? v : undefined;
  } catch {
    return undefined;
  }
}

function lambdaCall(req, body, res) {
  const deadline = Date.now() + timeoutMs;
  const h = req.headers;
  const rid = h['x-call-id'] || h['x-request-id'] || randomUUID();
  let event;
  if (body.length === 0) {
    event = {};
  } else {
    try {
      event = JSON.parse(body.toString('utf8'));
    } catch (e) {
      send(res, 400, JSON_TYPE, JSON.stringify({
        errorType: 'InvalidRequestContentException',
        errorMessage: 'Could not parse request body into json: ' + e.message,
      }));
      return;
    }
  }
  const ctx = new LambdaContext(rid, deadline, clientContext(h['x-amz-client-context']));
  settle(handler, event, ctx, (failed, value) => {
    if (failed) {
      const r = lambdaError(value);
      process.stderr.write(`${rid}\tERROR\tInvoke Error \t${JSON.stringify({ errorType: r.errorType, errorMessage: r.errorMessage, stack: r.trace })}\n`);
      send(res, 500, JSON_TYPE, JSON.stringify(r));
      return;
    }
    let s;
    try {
      s = JSON.stringify(value);
    } catch (e) {
      const msg = 'Unable to marshal response: ' + errorMessage(e);
      process.stderr.write(`${rid}\tERROR\tInvoke Error \t${JSON.stringify({ errorType: 'Runtime.MarshalError', errorMessage: msg })}\n`);
      send(res, 500, JSON_TYPE, JSON.stringify({ errorType: 'Runtime.MarshalError', errorMessage: msg, trace: [] }));
      return;
    }
    send(res, 200, JSON_TYPE, s === undefined ? 'null' : s);
  });
}

function errorMessage(e) {
  try {
    return e instanceof Error ? e.message : String(e);
  } catch {
    return 'unprintable error';
  }
}

// lambdaError is Lambda's error shape for what a handler threw or failed
// with.
function lambdaError(err) {
  try {
    if (err instanceof Error || (err && typeof err.stack === 'string' && typeof err.message === 'string')) {
      return {
        errorType: err.name || 'Error',
        errorMessage: err.message,
        trace: typeof err.stack === 'string' ? err.stack.split('\n') : [],
      };
    }
    return { errorType: typeof err, errorMessage: String(err), trace: [] };
  } catch {
    return {
      errorType: 'handled',
      errorMessage: 'callback called with Error argument, but there was a problem while retrieving one or more of its message, name, and stack',
      trace: [],
    };
  }
}

// ------------------------------------------------------------- http

// FunctionContext is OpenFaaS's node templates' context: chainable status
// and headers, and succeed/fail.
class FunctionContext {
  #deadline;
  constructor(requestId, deadline) {
    this.statusCode = 200;
    this.headerValues = {};
    this.functionName = functionName;
    this.requestId = requestId;
    this.cbCalled = 0;
    this.#deadline = deadline;
  }
  status(code) {
    if (code === undefined) return this.statusCode;
    this.statusCode = code;
    return this;
  }
  headers(value) {
    if (value === undefined) return this.headerValues;
    this.headerValues = value;
    return this;
  }
  succeed(value) {
    this.cbCalled++;
    if (this.cbCalled === 1) this[VALUE] = value;
    this[SETTLE](false, SUCCEEDED);
    return this;
  }
  fail(err) {
    this.cbCalled++;
    this[SETTLE](true, err);
    return this;
  }
  getRemainingTimeInMillis() {
    return Math.max(0, this.#deadline - Date.now());
  }
}

function isJSONType(t) {
  if (!t) return false;
  const i = t.indexOf(';');
  const mt = (i < 0 ? t : t.slice(0, i)).trim().toLowerCase();
  return mt === 'application/json' || mt.endsWith('+json');
}

function httpCall(req, body, res) {
  const deadline = Date.now() + timeoutMs;
  const h = req.headers;
  const rid = h['x-call-id'] || h['x-request-id'] || randomUUID();
  let url = req.url;
  if (url[0] !== '/') {
    // absolute-form: keep the path
    const s = url.indexOf('://');
    if (s >= 0) {
      const p = url.indexOf('/', s + 3);
      url = p < 0 ? '/' : url.slice(p);
    }
  }
  const q = url.indexOf('?');
  const text = body.toString('utf8');
  let parsed = text;
  if (text !== '' && isJSONType(h['content-type'])) {
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = text; // as it came
    }
  }
  const event = {
    body: parsed,
    rawBody: body,
    headers: h,
    method: req.method,
    path: q < 0 ? url : url.slice(0, q),
    query: q < 0 ? {} : querystring.parse(url.slice(q + 1)),
  };
  const ctx = new FunctionContext(rid, deadline);
  settle(handler, event, ctx, (failed, result) => {
    if (failed) {
      httpError(res, result);
      return;
    }
    let value;
    if (result === SUCCEEDED) {
      value = ctx[VALUE]; // context.succeed(value)
    } else if (result !== ctx) {
      value = result; // what the handler returned (or passed its callback)
    }
    // Else nothing but the context's status and headers.
    let status = ctx.statusCode;
    let headers = ctx.headerValues;
    let body;
    if (value !== null && typeof value === 'object' && !ArrayBuffer.isView(value) && 'statusCode' in value && !(value instanceof FunctionContext)) {
      status = value.statusCode;
      headers = Object.assign({}, ctx.headerValues, value.headers);
      body = value.body;
    } else {
      body = value;
    }
    let out;
    try {
      out = httpReply(res, status, headers, body);
    } catch (e) {
      httpError(res, e);
      return;
    }
    res.end(out);
  });
}

// httpReply writes the head of the reply status, headers and body make
// (body: a string or Buffer as it is, undefined or null none, another value
// JSON) and returns the body's bytes; it throws, having written nothing,
// when they make no valid reply.
function httpReply(res, status, headers, body) {
  if (typeof status === 'string' && /^[0-9]+$/.test(status)) status = Number(status);
  if (!Number.isInteger(status) || status < 200 || status > 999) {
    throw new RangeError(`statusCode ${JSON.stringify(status)} is not an HTTP status from 200 to 999`);
  }
  let out, type;
  if (body === undefined || body === null) {
    out = EMPTY;
    type = undefined;
  } else if (typeof body === 'string') {
    out = Buffer.from(body, 'utf8');
    type = TEXT_TYPE;
  } else if (Buffer.isBuffer(body)) {
    out = body;
    type = OCTET_TYPE;
  } else if (ArrayBuffer.isView(body)) {
    out = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
    type = OCTET_TYPE;
  } else {
    const s = JSON.stringify(body);
    out = Buffer.from(s === undefined ? 'null' : s, 'utf8');
    type = JSON_TYPE;
  }
  const head = {};
  let hasType = false;
  if (headers !== null && typeof headers === 'object') {
    for (const k of Object.keys(headers)) {
      const v = headers[k];
      if (v === undefined || v === null) continue;
      const lk = k.toLowerCase();
      if (lk === 'content-length' || lk === 'transfer-encoding' || lk === 'connection') continue;
      http.validateHeaderName(k);
      const vs = Array.isArray(v) ? v.map(String) : String(v);
      for (const x of Array.isArray(vs) ? vs : [vs]) http.validateHeaderValue(k, x);
      if (lk === 'content-type') hasType = true;
      head[k] = vs;
    }
  }
  if (status === 204 || status === 304) {
    res.writeHead(status, head);
    return undefined;
  }
  if (!hasType && type !== undefined) head['Content-Type'] = type;
  head['Content-Length'] = out.length;
  res.writeHead(status, head);
  return out;
}

function httpError(res, err) {
  let text;
  try {
    text = err !== null && typeof err === 'object' && typeof err.toString === 'function' ? err.toString() : String(err);
  } catch {
    text = 'unprintable error';
  }
  try {
    process.stderr.write(String((err && err.stack) || text) + '\n');
  } catch {
    process.stderr.write(text + '\n');
  }
  send(res, 500, TEXT_TYPE, text + '\n');
}

// ------------------------------------------------------------- snapshot

// A reason the handler cannot be in a snapshot.
class SnapshotError extends Error {}

// The built-in modules that node (20) cannot put in a snapshot: building
// one holding them fails (V8 aborts: "global handle not serialized", or
// http's methods.toSorted is not a function).
const UNSNAPSHOTTABLE = new Set([
  'http', 'https', 'http2', 'tls', 'repl',
  '_http_client', '_http_common', '_http_outgoing', '_http_server', '_stream_wrap', '_tls_common', '_tls_wrap',
]);

// buildSnapshot loads the handler (as loadHandler does, with require
// alone) in a process building a snapshot, and has a process started from
// it serve the handler.
function buildSnapshot() {
  configure();
  const Module = builtin('module');
  const vm = builtin('vm');
  // Node refuses to start from a snapshot holding modules its loader ran
  // (compiled with Module.prototype._compile): the runner compiles and
  // runs them itself while building, as that would. Native addons cannot
  // be in a snapshot.
  const load = Module._load;
  const compile = Module.prototype._compile;
  const loadAddon = Module._extensions['.node'];
  let refused = null; // the first thing found that cannot be in a snapshot
  const cannotSnapshot = (reason) => {
    refused ??= new SnapshotError(reason);
    return refused;
  };
  Module._load = function (request, parent, isMain) {
    const id = typeof request === 'string' && request.startsWith('node:') ? request.slice(5) : request;
    if (UNSNAPSHOTTABLE.has(id) && Module.isBuiltin(request)) {
      const by = parent && parent.filename ? ` (required by ${parent.filename})` : '';
      throw cannotSnapshot(`node ${process.version} cannot put built-in module "${id}" in a snapshot${by}`);
    }
    return Reflect.apply(load, this, arguments);
  };
  Module.prototype._compile = function (content, filename, format) {
    if (format === 'module') throw cannotSnapshot(`${filename} is an ES module`);
    return compileForSnapshot(vm, Module, this, content, filename, cannotSnapshot);
  };
  Module._extensions['.node'] = (m, filename) => {
    throw cannotSnapshot(`${filename} is a native addon`);
  };
  // The timers loading starts. Node runs the build's event loop until
  // nothing keeps it alive, then writes the snapshot: timers run then,
  // but an interval would keep the build running for ever, and a timer
  // unref'd is dropped (a process started from the snapshot never runs it).
  const timers = [];
  const hook = builtin('async_hooks')
    .createHook({
      init(id, type, trigger, resource) {
        if (type === 'Timeout') timers.push(resource);
      },
    })
    .enable();
  const before = { ...env };
  const built = { handlerName };
  const cwd = process.cwd();
  let fn;
  try {
    const { dir, found, file, name } = findHandler();
    built.dir = dir;
    if (found.endsWith('.mjs')) throw cannotSnapshot(`${found} is an ES module`);
    let m;
    try {
      m = Module.createRequire(__filename)(file); // as the runner requires it
    } catch (e) {
      if (e && e.code === 'ERR_REQUIRE_ESM') throw cannotSnapshot(`${found} is or loads an ES module: ${errorLine(e)}`);
      throw e;
    }
    fn = handlerIn(m, false, found, name);
  } catch (e) {
    if (refused === null) cannotLoad(e);
  }
  if (timers.some((t) => !t._destroyed && t._repeat !== null)) cannotSnapshot('it starts an interval timer as it loads');
  if (refused !== null) {
    // Even when the handler's modules caught it: the function would not
    // be what it is when started fresh.
    snapshotRefused(refused);
  }
  handler = fn;
  built.cwd = process.cwd();
  process.chdir(cwd); // node writes the snapshot where --snapshot-blob says, from here
  // What loading changed in process.env (dotenv and the like), [name,
  // value before, value after] (undefined: unset): the environment a
  // snapshot's process starts with is its own.
  built.envChanges = [];
  for (const k of new Set([...Object.keys(before), ...Object.keys(env)])) {
    if (before[k] !== env[k]) built.envChanges.push([k, before[k], env[k]]);
  }
  const { startupSnapshot } = builtin('v8');
  startupSnapshot.addSerializeCallback(() => {
    hook.disable();
    if (timers.some((t) => !t._destroyed)) snapshotRefused(new SnapshotError("it leaves a timer unref'd as it loads"));
  });
  startupSnapshot.setDeserializeMainFunction(() => {
    Module._load = load;
    Module.prototype._compile = compile;
    Module._extensions['.node'] = loadAddon;
    startFromSnapshot(built);
  });
}

function snapshotRefused(err) {
  process.stderr.write(`brisk: cannot snapshot handler ${handlerName}: ${err.message}\n`);
  process.exit(3);
}

// The syntax errors that make node load a .js file of no package type as
// an ES module (its --experimental-detect-module, on since 20.19).
const ESM_SYNTAX = [
  'Cannot use import statement outside a module',
  "Unexpected token 'export'",
  "Cannot use 'import.meta' outside a module",
  'await is only valid in async functions and the top level bodies of modules',
  'for await is only valid in async functions and the top level bodies of modules',
];

// compileForSnapshot runs a CommonJS module's code as Module.prototype.
// _compile does.
function compileForSnapshot(vm, Module, module, content, filename, cannotSnapshot) {
  if (content.startsWith('#!')) content = '//' + content.slice(2); // a hashbang line
  let fn;
  try {
    fn = vm.compileFunction(content, ['exports', 'require', 'module', '__filename', '__dirname'], {
      filename,
      importModuleDynamically: vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER,
    });
  } catch (e) {
    if (e instanceof SyntaxError && ESM_SYNTAX.includes(e.message)) {
      throw cannotSnapshot(`${filename} is an ES module (${e.message})`);
    }
    throw e;
  }
  const require = function require(id) {
    return module.require(id);
  };
  require.resolve = function resolve(request, options) {
    return Module._resolveFilename(request, module, false, options);
  };
  require.resolve.paths = function paths(request) {
    return Module._resolveLookupPaths(request, module);
  };
  require.main = process.mainModule;
  require.extensions = Module._extensions;
  require.cache = Module._cache;
  const exports = module.exports;
  return Reflect.apply(fn, exports, [exports, require, module, filename, path.dirname(filename)]);
}

// startFromSnapshot is a process started from a snapshot: it reads its
// environment and serves the handler loaded while building.
function startFromSnapshot(built) {
  // crypto draws random bytes in batches for randomUUID (128 UUIDs) and
  // randomInt (1024 draws of 6 bytes): a batch begun while building is in
  // the snapshot, and every process started from it would hand out the
  // same values. Drawing a batch's worth moves past its rest into a batch
  // of this process's own (0.75 ms). Math.random is seeded anew by V8, and
  // crypto.randomBytes and getRandomValues draw from OpenSSL, whose state
  // is not in the snapshot.
  for (let i = 0; i < 128; i++) randomUUID();
  for (let i = 0; i < 1024; i++) randomInt(1 << 30);
  // The handler's modules were compiled while building with
  // vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER, for their import() to
  // work as it does in modules node loads: node warns it is experimental
  // on the first import(), which a process started fresh would not.
  const emitWarning = process.emitWarning;
  process.emitWarning = function (warning, ...rest) {
    if (warning === 'vm.USE_MAIN_CONTEXT_DEFAULT_LOADER is an experimental feature and might change at any time') return;
    return Reflect.apply(emitWarning, this, [warning, ...rest]);
  };
  // Loading's changes to the environment, made again where the variable
  // is as it was before loading (a variable loading set only when unset,
  // as dotenv does, stays as this process has it).
  for (const [k, was, is] of built.envChanges) {
    if (env[k] !== was) continue;
    if (is === undefined) delete env[k];
    else env[k] = is;
  }
  configure();
  try {
    checkContract();
    if (env.BRISK_HANDLER !== undefined && handlerName !== built.handlerName) {
      throw new LoadError(`the snapshot holds handler "${built.handlerName}"`);
    }
    if (env.BRISK_CODE_DIR !== undefined && path.resolve(env.BRISK_CODE_DIR) !== built.dir) {
      throw new LoadError(`the snapshot holds code from ${built.dir}, not ${path.resolve(env.BRISK_CODE_DIR)}`);
    }
    handlerName = built.handlerName;
    process.chdir(built.cwd);
  } catch (e) {
    cannotLoad(e);
  }
  http = require('http');
  serve();
}

// ------------------------------------------------------------- main

// warmUp sends one request through a server made as serve() makes it,
// answered by the runner without the handler, so that a standby's first
// call does not wait for node to compile its HTTP code (a few ms). Best
// effort: it resolves whatever happens.
function warmUp() {
  return new Promise((done) => {
    const server = http.createServer(SERVER_OPTIONS, (req, res) => {
      req.resume();
      req.on('end', () => send(res, 200, JSON_TYPE, '{}'));
    });
    server.on('error', () => done());
    server.listen(0, '127.0.0.1', () => {
      const end = () => server.close(() => done());
      const r = http.request({ host: '127.0.0.1', port: server.address().port, method: 'POST', agent: false, headers: { 'Content-Type': JSON_TYPE } }, (res) => {
        res.resume();
        res.on('end', end);
      });
      r.on('error', end);
      r.end('{}');
    });
  });
}

// standby parks the loaded runner as its function's standby (brisk's
// templates for Node, docs/languages.md): it says "ready" on the control
// socket fd (a SOCK_SEQPACKET socket to the worker) and blocks until the
// worker hands it a sandbox: that sandbox's whole environment and port.
// The runner then takes them in place of its own, answers with its pid
// and serves: this process is the sandbox (Node cannot fork). The worker
// has moved its output into the sandbox's log and moves the process into
// the sandbox's cgroup. A closed socket ends the standby.
function standby(fd) {
  const send = (obj) => {
    try {
      fs.writeSync(fd, JSON.stringify(obj));
    } catch {
      process.exit(0); // the worker is gone
    }
  };
  send({ op: 'ready' });
  const buf = Buffer.alloc(1 << 20);
  let n = 0;
  for (;;) {
    try {
      n = fs.readSync(fd, buf, 0, buf.length, null);
      break;
    } catch (e) {
      if (e.code !== 'EAGAIN' && e.code !== 'EINTR') process.exit(0);
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 2);
    }
  }
  if (n === 0) process.exit(0);
  let req;
  try {
    req = JSON.parse(buf.toString('utf8', 0, n));
    if (req.op !== 'fork' || !Array.isArray(req.env) || !(req.port > 0)) throw new Error('want a fork request');
  } catch (e) {
    send({ op: 'error', id: String((req && req.id) || ''), error: String(e.message) });
    process.exit(1);
  }
  for (const k of Object.keys(env)) delete env[k];
  for (const kv of req.env) {
    const i = String(kv).indexOf('=');
    if (i > 0) env[kv.slice(0, i)] = kv.slice(i + 1);
  }
  env.PORT = String(req.port);
  configure();
  send({ op: 'forked', id: String(req.id), pid: process.pid });
  fs.closeSync(fd);
  serve();
}

if (building) {
  buildSnapshot();
} else {
  // A standby's control socket is the worker's, not the function's.
  const ctl = env.BRISK_TEMPLATE_FD;
  delete env.BRISK_TEMPLATE_FD;
  configure();
  loadHandler().then(
    (fn) => {
      handler = fn;
      if (ctl !== undefined) warmUp().then(() => standby(positive(ctl, 3)));
      else serve();
    },
    cannotLoad,
  );
}
