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
'use strict';

const http = require('http');
const fs = require('fs');
const path = require('path');
const querystring = require('querystring');
const { randomUUID, randomBytes } = require('crypto');
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

const functionName = env.BRISK_FUNCTION || env.AWS_LAMBDA_FUNCTION_NAME || '';
const timeoutMs = positive(env.BRISK_TIMEOUT_MS, 300000);
const memoryMB = String(positive(env.BRISK_MEMORY_MB, 128));
const contract = env.BRISK_CONTRACT || 'lambda';
const handlerName = env.BRISK_HANDLER || '';
const arn = 'arn:aws:lambda:brisk:000000000000:function:' + functionName;
const logGroup = '/aws/lambda/' + functionName;
let logStream = '';

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

async function loadHandler() {
  if (contract !== 'lambda' && contract !== 'http') {
    throw new LoadError(`contract "${contract}" is not "lambda" or "http"`);
  }
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
  const file = path.join(dir, found);
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

function serve() {
  const d = new Date();
  const pad = (n) => String(n).padStart(2, '0');
  logStream = `${d.getUTCFullYear()}/${pad(d.getUTCMonth() + 1)}/${pad(d.getUTCDate())}/[$LATEST]${randomBytes(16).toString('hex')}`;
  const call = contract === 'http' ? httpCall : lambdaCall;
  const server = http.createServer(
    {
      maxHeaderSize: MAX_HEAD,
      // Only for receiving a request (a handler may run longer).
      requestTimeout: 300000,
      headersTimeout: 66000,
      noDelay: true,
    },
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

// ------------------------------------------------------------- main

loadHandler().then(
  (fn) => {
    handler = fn;
    serve();
  },
  cannotLoad,
);
